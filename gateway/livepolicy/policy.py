"""The runtime policy: one pydantic schema for everything ops tune live, loaded, validated and diffed.

A Policy object is immutable once built; reloading builds a new one and swaps the reference, so a
request in flight keeps the object it started with.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import Field, ValidationError, model_validator

from gateway.admission.settings import (
    AdmissionSettings,
    BudgetPolicy,
    ControllerPolicy,
    FairnessPolicy,
    QueuePolicy,
    WindowPolicy,
)
from gateway.backends.settings import CircuitPolicy
from gateway.estimate.settings import BucketPolicy, EstimationPolicy
from gateway.observability.settings import AlertThresholds
from gateway.request.media_urls import MediaUrlPolicy
from gateway.settings.schema import Frozen, FrozenDict, describe
from gateway.tenants.settings import TenantDefaults


class Timeouts(Frozen):
    """Upstream timeouts in seconds: connect, wait for the first byte, idle gap between chunks, total."""

    connect: float = Field(2.0, gt=0)
    first_byte: float = Field(120.0, gt=0)
    idle: float = Field(60.0, gt=0)
    total: float = Field(1800.0, gt=0)


class PoolPolicy(Frozen):
    timeouts: Timeouts = Field(default_factory=Timeouts)
    retries: int = Field(1, ge=0, le=3, description="Retries on another backend before the first byte.")
    media_urls: MediaUrlPolicy = Field(
        default_factory=MediaUrlPolicy,
        description="What the pool's engines may be asked to fetch (default: no remote media).",
    )
    circuit: CircuitPolicy = Field(default_factory=CircuitPolicy)


def _merged(base: Any, override: Any) -> Any:
    """`override` laid over `base`, mapping by mapping: a pool names only what differs from the defaults."""
    if not isinstance(base, dict) or not isinstance(override, dict):
        return override
    return {**base, **{k: _merged(base.get(k), v) for k, v in override.items()}}


class Policy(Frozen):
    version: int = 1
    pool_defaults: PoolPolicy = Field(default_factory=PoolPolicy)
    pools: FrozenDict[str, PoolPolicy] = Field(default_factory=dict)
    queue: QueuePolicy = Field(default_factory=QueuePolicy)
    budgets: BudgetPolicy = Field(default_factory=BudgetPolicy)
    window: WindowPolicy = Field(default_factory=WindowPolicy)
    controller: ControllerPolicy = Field(default_factory=ControllerPolicy)
    fairness: FairnessPolicy = Field(default_factory=FairnessPolicy)
    estimation: EstimationPolicy = Field(default_factory=EstimationPolicy)
    buckets: BucketPolicy = Field(default_factory=BucketPolicy)
    tenant_defaults: TenantDefaults = Field(default_factory=TenantDefaults)
    alerts: AlertThresholds = Field(default_factory=AlertThresholds)
    model_aliases: FrozenDict[str, str] = Field(
        default_factory=dict,
        description="Alias → a model the pools serve: requests may name the alias (it is listed in "
        "/v1/models); the engine is sent the served name.",
    )

    @model_validator(mode="before")
    @classmethod
    def _pools_inherit(cls, data: Any) -> Any:
        """Fill each `pools.<name>` from `pool_defaults` (nested sections key by key): without this,
        `pools: {offline: {retries: 0}}` silently reset that pool's timeouts and breaker to the code
        defaults."""
        if not isinstance(data, dict) or not isinstance(data.get("pools"), dict):
            return data
        base = data.get("pool_defaults") or {}
        return {**data, "pools": {name: _merged(base, o) for name, o in data["pools"].items()}}

    def pool(self, name: str) -> PoolPolicy:
        return self.pools.get(name, self.pool_defaults)

    @cached_property
    def admission(self) -> AdmissionSettings:
        """The sections the pools' schedulers decide by (built once per policy object)."""
        return AdmissionSettings(
            queue=self.queue,
            budgets=self.budgets,
            window=self.window,
            controller=self.controller,
            fairness=self.fairness,
            default_weight=self.tenant_defaults.weight,
        )


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the file and the offending fields."""


def parse_policy(data: Any, source: str = "<policy>") -> Policy:
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        raise PolicyError(f"{source}: {describe(e)}") from None


def load_policy_text(text: str, source: str = "<policy>") -> Policy:
    """A whole policy document, or PolicyError. Every key left out takes its default, so a document cut
    short would silently reset what it lost: an empty document, one that does not name `version`, or one
    that ends mid-line (no final newline: a save in progress or cut off) is refused, never applied."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyError(f"{source}: invalid YAML: {e}") from None
    if data is None:
        raise PolicyError(f"{source}: empty policy document (would reset every setting to its default)")
    if not text.endswith("\n"):
        raise PolicyError(
            f"{source}: the document ends mid-line (no final newline): cut short or being written"
        )
    if isinstance(data, dict) and "version" not in data:
        raise PolicyError(f"{source}: no `version` key: not a whole policy document (cut short?)")
    return parse_policy(data, source)


def load_policy(path: str | Path) -> Policy:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyError(f"{p}: cannot read: {e.strerror}") from None
    return load_policy_text(text, str(p))


def policy_schema() -> dict[str, Any]:
    """JSON Schema of the policy file, for editors (yaml-language-server) and CI checks."""
    schema = Policy.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "omnigate policy"
    return schema


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        if not value and prefix:
            out[prefix] = {}
        return out
    return {prefix: value}


def diff_policies(old: Policy | dict[str, Any], new: Policy | dict[str, Any]) -> list[str]:
    """Readable lines `path: old -> new`, one per changed leaf, sorted by path."""
    a = _flatten(old.model_dump(mode="json") if isinstance(old, Policy) else old)
    b = _flatten(new.model_dump(mode="json") if isinstance(new, Policy) else new)
    lines = []
    for key in sorted(set(a) | set(b)):
        if (a.get(key, b.get(key)) == {}) and any(k.startswith(key + ".") for k in (*a, *b)):
            continue  # an empty mapping that gained (or lost) entries: the entries' own lines say it
        if key not in a:
            lines.append(f"+ {key}: {orjson.dumps(b[key]).decode()}")
        elif key not in b:
            lines.append(f"- {key}: {orjson.dumps(a[key]).decode()}")
        elif a[key] != b[key]:
            lines.append(f"~ {key}: {orjson.dumps(a[key]).decode()} -> {orjson.dumps(b[key]).decode()}")
    return lines
