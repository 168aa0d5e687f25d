"""OpenAI's `x-ratelimit-*` response headers, from a tenant's per-minute buckets.

OpenAI's SDKs and most client libraries read them to pace themselves. Each limit is a bucket of capacity
L refilled at L/60 per second (gateway/tenants/quota.py), so: limit = L, remaining = the bucket's level
after this request (0 while in debt), reset = the time until the bucket is full again — "the time until the
rate limit resets to its initial state", written as OpenAI writes it (`1s`, `6m0s`, `20ms`). `requests` is
the tenant's `rpm`; `tokens` its `total_tpm`, else `input_tpm`, else `output_tpm`; `audio-seconds` (not
OpenAI's: speech out) its `audio_spm`. A limit the tenant does not have gets no headers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gateway.tenants.models import Quotas

LIMITS = (
    ("requests", ("rpm",)),
    ("tokens", ("total_tpm", "input_tpm", "output_tpm")),
    ("audio-seconds", ("audio_spm",)),
)


def go_duration(seconds: float) -> str:
    """Go's `time.Duration` format at millisecond precision, rounded up (a client that waits this long
    finds the limit reset): `0s`, `12ms`, `1s`, `1.5s`, `6m0s`, `1h0m0s`."""
    ms = max(0, math.ceil(round(seconds * 1000, 6)))
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    return f"{minutes}m{secs}" if minutes else secs


def ratelimit_headers(quotas: Quotas, levels: Mapping[str, float]) -> dict[str, str]:
    """The header triples for the limits the tenant has; `levels` are its buckets' current levels."""
    out: dict[str, str] = {}
    for kind, names in LIMITS:
        name = next((n for n in names if getattr(quotas, n) is not None and n in levels), None)
        if name is None:
            continue
        limit: int = getattr(quotas, name)
        level = min(float(limit), levels[name])
        out[f"x-ratelimit-limit-{kind}"] = str(limit)
        out[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(level)))
        out[f"x-ratelimit-reset-{kind}"] = go_duration((limit - level) * 60.0 / limit)
    return out
