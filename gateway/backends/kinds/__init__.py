"""Backend kinds: one adapter per kind of server behind a pool (the interface is `base.BackendKind`)."""

from __future__ import annotations

from collections.abc import Callable

from gateway.backends.kinds.base import BackendKind
from gateway.backends.kinds.sglang import SGLang
from gateway.backends.kinds.sglang_omni import SGLangOmni
from gateway.settings.config import PoolConfig

_KINDS: dict[str, Callable[[PoolConfig], BackendKind]] = {SGLang.name: SGLang, SGLangOmni.name: SGLangOmni}


def adapter_for(config: PoolConfig) -> BackendKind:
    """The adapter of the pool's `kind` (the config schema admits only kinds listed here)."""
    return _KINDS[config.kind](config)
