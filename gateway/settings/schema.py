"""The base of every settings schema, and the one way a validation error is told to a person.

Config, policy sections, tenant defaults, the demo's and the harness's files all derive from `Frozen`:
unknown keys are errors (a typo never passes silently) and a validated object never changes (a reload
builds a new one; a request in flight keeps the one it started with). Collections inside are tuples and
`FrozenDict`s (read-only mappings), so nothing can be added to them either; defaults are validated too, so
a default mapping is read-only like a parsed one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, WrapSerializer

log = logging.getLogger("omnigate.policy")

K = TypeVar("K")
V = TypeVar("V")


def _as_dict(value: Mapping[Any, Any], handler: Callable[[Any], Any]) -> Any:
    return handler(dict(value))


FrozenDict = Annotated[Mapping[K, V], AfterValidator(MappingProxyType), WrapSerializer(_as_dict)]
"""A mapping field that cannot be changed after validation (serialised as a plain dict)."""


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def drop_removed(data: Any, section: str, removed: Mapping[str, str]) -> Any:
    """`data` without the keys its section no longer has (`removed`: key → what replaced it), each one
    logged as a warning. Ignored rather than refused: the shipped default policy named some of them, and
    replicas mid-upgrade read one file, so an error would stop a gateway for a setting that no longer
    does anything; the warning (at every load, and from `omnigate policy check`) says to delete it."""
    if not isinstance(data, Mapping) or not removed.keys() & data.keys():
        return data
    for key in sorted(removed.keys() & data.keys()):
        log.warning("policy: %s.%s is ignored, it was removed: %s; delete it", section, key, removed[key])
    return {k: v for k, v in data.items() if k not in removed}


def location(err: ValidationError) -> str:
    """The dotted location of the first error (empty for the root)."""
    errors = err.errors()
    return ".".join(str(p) for p in errors[0]["loc"]) if errors else ""


def describe(err: ValidationError, prefix: str = "") -> str:
    """Every error as `location: message`, joined by `; `; `prefix` leads each location (e.g. `demo`)."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "") or "(root)"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)
