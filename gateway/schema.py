"""The base of every settings schema, and the one way a validation error is told to a person.

Config, policy sections, tenant defaults, the demo's and the harness's files all derive from `Frozen`:
unknown keys are errors (a typo never passes silently) and a validated object never changes (a reload
builds a new one; a request in flight keeps the one it started with). Collections inside are tuples, not
lists, so nothing can be appended to them either.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
