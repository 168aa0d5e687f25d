"""Metric definitions, identical to vLLM's bench serve so our numbers compare with the field's.

- request throughput = completed requests / duration; token throughputs likewise with server usage.
- TTFT = send → first content chunk; E2E = send → last byte; TPOT = (E2E − TTFT) / (N − 1) per request
  with N the server-reported output tokens (requests with N ≤ 1 have no TPOT); ITL = every gap between
  successive content chunks of successful requests.
- SLO attainment = requests meeting every SLO / all requests sent (rejections and errors count as
  misses, so shedding load never improves attainment); goodput = requests meeting every SLO / duration.
- Percentiles interpolate linearly between closest ranks (numpy's default, as vLLM uses).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from loadtest.records import RequestRecord
from loadtest.workload import Slo

PERCENTILES = (50, 95, 99)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile of a non-empty list (numpy.percentile's default method)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats(values: list[float]) -> dict[str, float] | None:
    """mean / p50 / p95 / p99 / max, or None when there is nothing to summarise."""
    if not values:
        return None
    out = {"mean": sum(values) / len(values)}
    out.update({f"p{q}": percentile(values, q) for q in PERCENTILES})
    out["max"] = max(values)
    return out


def tpot(rec: RequestRecord) -> float | None:
    """Seconds per output token after the first; None for a whole answer (every token came at once) and for
    an answer of audio only (its pace is its real-time factor)."""
    if not rec.ok or rec.ttft is None or rec.e2e is None or rec.output_tokens <= 1 or rec.ttft == rec.e2e:
        return None
    if rec.audio and not rec.chunk_times:
        return None
    return (rec.e2e - rec.ttft) / (rec.output_tokens - 1)


def itls(rec: RequestRecord) -> list[float]:
    c = rec.chunk_times
    return [b - a for a, b in itertools.pairwise(c)] if rec.ok else []


def meets_slo(rec: RequestRecord, slo: Slo) -> bool:
    if not rec.ok:
        return False
    if slo.ttft_ms is not None and (rec.ttft is None or rec.ttft * 1000 > slo.ttft_ms):
        return False
    t = tpot(rec)
    if slo.tpot_ms is not None and t is not None and t * 1000 > slo.tpot_ms:
        return False
    if slo.e2e_ms is not None and (rec.e2e is None or rec.e2e * 1000 > slo.e2e_ms):
        return False
    speech = rec.speech
    if speech is None:
        return True
    if slo.ttfa_ms is not None and (rec.ttfa is None or rec.ttfa * 1000 > slo.ttfa_ms):
        return False
    rtf = speech.rtf
    return not (slo.rtf is not None and rtf is not None and rtf > slo.rtf)


def _speech(ok: list[RequestRecord], per_s: Callable[[float], float]) -> dict[str, Any]:
    """Time to first audio, real-time factor (streams of two chunks or more), the share of speaking streams
    that stalled, audio seconds per second; nothing when no answer spoke."""
    spoken = [(r, m) for r in ok if (m := r.speech) is not None]
    if not spoken:
        return {}
    streams = [m for _, m in spoken if m.chunks > 1]
    return {
        "ttfa_ms": stats(_ms(r.ttfa for r, _ in spoken)),
        "rtf": stats([rtf for m in streams if (rtf := m.rtf) is not None]),
        "stalled_rate": sum(m.stalls > 0 for m in streams) / len(streams) if streams else None,
        "audio_seconds_per_s": per_s(sum(m.seconds for _, m in spoken)),
    }


def _ms(values: Iterable[float | None]) -> list[float]:
    return [v * 1000 for v in values if v is not None]


def span(records: list[RequestRecord]) -> float:
    """Benchmark duration as vLLM defines it: first send to last completion."""
    if not records:
        return 0.0
    start = min(r.sent for r in records)
    end = max(r.sent + (r.e2e or 0.0) for r in records)
    return end - start


def summarize(
    records: list[RequestRecord], slo: Slo, duration: float | None = None, gpus: float = 0.0
) -> dict[str, Any]:
    """The full table for one set of records (one run, or one slice of a breakdown)."""
    dur = duration if duration is not None else span(records)
    ok = [r for r in records if r.ok]
    n, n_ok = len(records), len(ok)
    rejected = sum(r.rejected for r in records)
    good = sum(meets_slo(r, slo) for r in records)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)

    def per_s(x: float) -> float:
        return x / dur if dur > 0 else 0.0

    def rate(x: int) -> float:
        return x / n if n else 0.0

    return {
        "requests": n,
        "completed": n_ok,
        "rejected": rejected,
        "errors": n - n_ok - rejected,
        "duration_s": dur,
        "request_throughput": per_s(n_ok),
        "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(out_tokens + in_tokens),
        "total_output_tokens": out_tokens,
        "total_input_tokens": in_tokens,
        "ttft_ms": stats(_ms(r.ttft for r in ok)),
        "tpot_ms": stats(_ms(tpot(r) for r in ok)),
        "itl_ms": stats(_ms(g for r in ok for g in itls(r))),
        "e2e_ms": stats(_ms(r.e2e for r in ok)),
        **_speech(ok, per_s),
        "queue_ms": stats([q for r in records if (q := r.queue_ms) is not None]),
        "slo": slo.model_dump(),
        "slo_attainment": rate(good),
        "goodput": per_s(good),
        "rejection_rate": rate(rejected),
        "error_rate": rate(n - n_ok - rejected),
        "error_codes": dict(Counter(r.error or f"http_{r.status}" for r in records if not r.ok)),
        "send_lag_ms": stats(_ms(r.send_lag for r in records)),
        "outer_wait_ms": stats(_ms(r.outer_wait for r in records))
        if any(r.outer_wait for r in records)
        else None,
        "gpu_seconds_per_success": (gpus * dur / n_ok) if gpus > 0 and n_ok else None,
    }


BREAKDOWNS: dict[str, Callable[[RequestRecord], object]] = {
    "bucket": lambda r: r.bucket,
    "tenant": lambda r: r.tenant,
    "priority": lambda r: r.priority,
    "class": lambda r: r.traffic_class,
    "backend": lambda r: r.headers.get("x-omnigate-backend"),
}


def breakdowns(records: list[RequestRecord], slo: Slo, duration: float) -> dict[str, dict[str, Any]]:
    """Per bucket / tenant / priority / class / backend tables; dimensions with one value are skipped."""
    out: dict[str, dict[str, Any]] = {}
    for dim, key in BREAKDOWNS.items():
        groups: dict[str, list[RequestRecord]] = {}
        for r in records:
            k = key(r)
            if k is not None and k != "":
                groups.setdefault(str(k), []).append(r)
        if len(groups) > 1 or (dim == "bucket" and groups):
            out[dim] = {k: summarize(v, slo, duration) for k, v in sorted(groups.items())}
    return out


def time_series(records: list[RequestRecord], step: float = 1.0) -> list[dict[str, Any]]:
    """Per-step offered QPS (by send time); completions, refusals by error code, errors, tokens and latency
    P50/P99s (by finish time); for answers that speak, time to first audio and real-time factor P99."""
    if not records:
        return []
    t0 = min(r.sent for r in records)
    n = int(span(records) // step) + 1
    rows: list[dict[str, Any]] = [
        {
            "t": i * step,
            "sent": 0,
            "completed": 0,
            "failed": 0,
            "errors": 0,
            "rejected_by": {},
            "output_tokens": 0,
        }
        for i in range(n)
    ]
    samples: list[dict[str, list[float]]] = [
        {"ttft": [], "tpot": [], "ttfa": [], "rtf": []} for _ in range(n)
    ]
    for r in records:
        rows[min(int((r.sent - t0) // step), n - 1)]["sent"] += 1
        i = min(int((r.sent + (r.e2e or 0.0) - t0) // step), n - 1)
        row, got = rows[i], samples[i]
        if not r.ok:
            row["failed"] += 1
            if r.rejected:
                code = r.error or f"http_{r.status}"
                row["rejected_by"][code] = row["rejected_by"].get(code, 0) + 1
            else:
                row["errors"] += 1
            continue
        row["completed"] += 1
        row["output_tokens"] += r.output_tokens
        if r.ttft is not None:
            got["ttft"].append(r.ttft * 1000)
        if (t := tpot(r)) is not None:
            got["tpot"].append(t * 1000)
        if r.ttfa is not None:
            got["ttfa"].append(r.ttfa * 1000)
        if (speech := r.speech) is not None and speech.chunks > 1 and (rtf := speech.rtf) is not None:
            got["rtf"].append(rtf)
    for row, got in zip(rows, samples, strict=True):
        row["qps"] = row["sent"] / step
        for name, unit in (("ttft", "_ms"), ("tpot", "_ms"), ("ttfa", "_ms"), ("rtf", "")):
            for q in (50, 99):
                row[f"{name}_p{q}{unit}"] = percentile(got[name], q) if got[name] else None
    return rows


def crash_errors(records: list[RequestRecord]) -> list[RequestRecord]:
    """Failures that look like a dying engine: 5xx other than queue-full 503, and broken connections."""
    return [r for r in records if r.error == "transport" or (r.status >= 500 and r.status != 503)]


def error_bursts(records: list[RequestRecord], threshold: int = 5, step: float = 1.0) -> int:
    """Seconds in which at least `threshold` crash-like failures happened (an OOM signature)."""
    per_step = Counter(int((r.sent + (r.e2e or 0.0)) // step) for r in crash_errors(records))
    return sum(1 for c in per_step.values() if c >= threshold)
