"""Which pool serves a request: the model names the pools that serve it, the traffic class picks one."""

from __future__ import annotations

from collections.abc import Iterable

from gateway.backends.pool import Pool
from gateway.errors import ApiError, ErrorCode
from gateway.policy import Policy


class Router:
    def __init__(self, pools: Iterable[Pool]) -> None:
        self.models: dict[str, list[Pool]] = {}  # model → the pools serving it, in config order
        for pool in pools:
            for model in pool.config.models:
                self.models.setdefault(model, []).append(pool)

    def route(self, model: str, traffic_class: str, policy: Policy) -> Pool:
        """The pool the class names (policy `queue.classes.<class>.pool`, else the pool of that name or
        traffic class) among those serving `model`; the first of them if none matches."""
        pools = self.models.get(model)
        if not pools:
            raise ApiError(
                404, f"The model `{model}` does not exist.", param="model", code=ErrorCode.MODEL_NOT_FOUND
            )
        wanted = policy.queue.classes[traffic_class].pool or traffic_class
        for pool in pools:
            if pool.name == wanted or pool.config.traffic_class == traffic_class:
                return pool
        return pools[0]
