"""Settings are immutable all the way down: every schema in the config and the policy is a frozen model, and
holds tuples and read-only mappings, never a list or dict that code could change in place."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from types import MappingProxyType, UnionType

import pytest
from pydantic import BaseModel, ValidationError

from gateway.livepolicy.policy import Policy
from gateway.settings.config import GatewayConfig, parse_config
from gateway.settings.schema import Frozen


def _models(root: type[BaseModel]) -> Iterator[type[BaseModel]]:
    seen: set[type[BaseModel]] = set()
    todo = [root]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        yield model
        for field in model.model_fields.values():
            todo += [t for t in _types(field.annotation) if isinstance(t, type) and issubclass(t, BaseModel)]


def _types(annotation: object) -> Iterator[object]:
    yield annotation
    if typing.get_origin(annotation) is typing.Annotated:
        yield from _types(typing.get_args(annotation)[0])
        return
    for arg in typing.get_args(annotation):
        yield from _types(arg)


@pytest.mark.parametrize("root", [Policy, GatewayConfig])
def test_every_section_is_frozen(root: type[BaseModel]) -> None:
    thawed = [
        m.__qualname__ for m in _models(root) if not issubclass(m, Frozen) or not m.model_config["frozen"]
    ]
    assert thawed == []


@pytest.mark.parametrize("root", [Policy, GatewayConfig])
def test_no_section_holds_a_list_or_a_dict(root: type[BaseModel]) -> None:
    mutable = []
    for model in _models(root):
        for name, field in model.model_fields.items():
            origins = {typing.get_origin(t) or t for t in _types(field.annotation)} - {UnionType}
            if origins & {list, dict, set}:
                mutable.append(f"{model.__qualname__}.{name}")
    assert mutable == []


def test_a_parsed_policy_cannot_be_changed_in_place() -> None:
    policy = Policy.model_validate(
        {"pools": {"a": {"retries": 2}}, "alerts": {"queue_depth_per_pool": {"a": 3}}}
    )
    with pytest.raises(ValidationError):
        policy.pool("a").timeouts.idle = 1.0  # type: ignore[misc]
    assert isinstance(policy.pools, MappingProxyType) and isinstance(
        policy.alerts.for_overrides, MappingProxyType
    )
    with pytest.raises(TypeError):
        policy.alerts.queue_depth_per_pool["b"] = 1  # type: ignore[index]
    assert policy.model_dump()["alerts"]["queue_depth_per_pool"] == {"a": 3}  # still plain data outside


def test_a_parsed_config_cannot_be_changed_in_place() -> None:
    config = parse_config(
        {"pools": [{"name": "p", "models": ["m"], "backends": ["http://127.0.0.1:1"]}]}, environ={}
    )
    with pytest.raises(ValidationError):
        config.listen.port = 1  # type: ignore[misc]
    assert config.pools[0].backends == ("http://127.0.0.1:1",)
