"""Which pool serves a request: the model names the pools that serve it, the traffic class picks one."""

from __future__ import annotations

from collections.abc import Iterable

from gateway.backends.pool import Pool
from gateway.livepolicy.policy import Policy
from gateway.request.errors import ApiError, ErrorCode


class Router:
    def __init__(self, pools: Iterable[Pool]) -> None:
        self.models: dict[str, list[Pool]] = {}  # model → the pools serving it, in config order
        for pool in pools:
            for model in pool.config.models:
                self.models.setdefault(model, []).append(pool)

    def route(self, model: str, traffic_class: str, policy: Policy) -> Pool:
        """The pool the class names (policy `queue.classes.<class>.pool`, else the pool of that name or
        traffic class) among those serving `model`. None of them: 400, never another class's pool (offline
        work must not land on the interactive engines)."""
        pools = self.models.get(model)
        if not pools:
            raise ApiError(
                404, f"The model `{model}` does not exist.", param="model", code=ErrorCode.MODEL_NOT_FOUND
            )
        wanted = policy.queue.classes[traffic_class].pool or traffic_class
        for pool in pools:
            if pool.name == wanted or pool.config.traffic_class == traffic_class:
                return pool
        raise ApiError(
            400,
            f"Traffic class '{traffic_class}' routes to pool '{wanted}', which does not serve model "
            f"`{model}` (served by: {', '.join(p.name for p in pools)}).",
            param="x-omnigate-class",
            code=ErrorCode.NO_POOL_FOR_CLASS,
        )
