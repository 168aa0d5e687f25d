"""The models the gateway serves, as OpenAI lists them (`GET /v1/models`, `GET /v1/models/{id}`): every
model a pool serves, and every alias the policy defines (`model_aliases`) with the served model it stands
for in `root` (as SGLang and vLLM name a model's origin)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gateway.request.errors import ApiError, ErrorCode


def _card(model_id: str, root: str | None = None) -> dict[str, Any]:
    card: dict[str, Any] = {"id": model_id, "object": "model", "created": 0, "owned_by": "omnigate"}
    if root is not None:
        card["root"] = root
    return card


def model_cards(served: Collection[str], aliases: Mapping[str, str]) -> list[dict[str, Any]]:
    cards = [_card(m) for m in served] + [_card(a, m) for a, m in aliases.items() if m in served]
    return sorted(cards, key=lambda c: c["id"])


def model_card(model_id: str, served: Collection[str], aliases: Mapping[str, str]) -> dict[str, Any]:
    if model_id in served:
        return _card(model_id)
    root = aliases.get(model_id)
    if root is not None and root in served:
        return _card(model_id, root)
    raise ApiError(
        404, f"The model `{model_id}` does not exist.", param="model", code=ErrorCode.MODEL_NOT_FOUND
    )
