"""The base of every settings schema, and the one way a validation error is told to a person.

Config, policy sections, tenant defaults, the demo's and the harness's files all derive from `Frozen`:
unknown keys are errors (a typo never passes silently) and a validated object never changes (a reload
builds a new one; a request in flight keeps the one it started with). Collections inside are tuples and
`FrozenDict`s (read-only mappings), so nothing can be added to them either; defaults are validated too, so
a default mapping is read-only like a parsed one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, WrapSerializer

K = TypeVar("K")
V = TypeVar("V")


def _as_dict(value: Mapping[Any, Any], handler: Callable[[Any], Any]) -> Any:
    return handler(dict(value))


FrozenDict = Annotated[Mapping[K, V], AfterValidator(MappingProxyType), WrapSerializer(_as_dict)]
"""A mapping field that cannot be changed after validation (serialised as a plain dict)."""


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


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
