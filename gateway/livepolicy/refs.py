"""The policy checked against the config it runs with: every pool it names exists, every model alias
names a served model.

The policy is tuned live and the pools are fixed at start, so a typo in a pool name (`budgets.pools.
interactve`) would otherwise be accepted and silently ignored. Only what the policy file itself writes is
checked: the code defaults name the usual pools (`interactive`, `offline`), and a default that names a pool
this deployment does not run changes nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping

from pydantic import BaseModel

from gateway.livepolicy.policy import Policy, PolicyError


def _written(model: BaseModel, *path: str) -> bool:
    """True if the policy file set the field at `path` (not left to its default)."""
    node: BaseModel = model
    for name in path:
        if name not in node.model_fields_set:
            return False
        node = getattr(node, name)
    return True


def pool_references(policy: Policy) -> Iterator[tuple[str, str]]:
    """(field, pool name) for every pool the policy file names."""
    for name in policy.pools:
        yield f"pools.{name}", name
    for name in policy.budgets.pools:
        yield f"budgets.pools.{name}", name
    if _written(policy, "window", "accumulate"):
        for name in policy.window.accumulate:
            yield f"window.accumulate.{name}", name
    if _written(policy, "queue", "classes"):
        for cls, slo in policy.queue.classes.items():
            if slo.pool is not None:
                yield f"queue.classes.{cls}.pool", slo.pool
    for name in policy.alerts.queue_depth_per_pool:
        yield f"alerts.queue_depth_per_pool.{name}", name


def unknown_refs(policy: Policy, pools: Mapping[str, Collection[str]]) -> list[str]:
    """One line per field that names a pool not in `pools` (pool name → the models it serves) or aliases
    a model no pool serves."""
    refs = pool_references(policy)
    errors = [f"{field}: no pool named {name!r}" for field, name in refs if name not in pools]
    served = {model for models in pools.values() for model in models}
    for alias, model in policy.model_aliases.items():
        if alias in served:
            errors.append(f"model_aliases.{alias}: a served model's own name cannot be an alias")
        elif model not in served:
            errors.append(f"model_aliases.{alias}: no pool serves model {model!r}")
    return errors


def check_refs(policy: Policy, pools: Mapping[str, Collection[str]], source: str = "<policy>") -> None:
    """Raise PolicyError naming every field that names a pool or a model the config does not run."""
    errors = unknown_refs(policy, pools)
    if errors:
        known = ", ".join(sorted(pools))
        raise PolicyError(f"{source}: {'; '.join(errors)} (the config's pools: {known})")
