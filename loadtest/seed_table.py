"""The seed article's table and validate-seed's judgement against it: the side-by-side table, ours ÷ seed
with the physical reason where far, the point-by-point shape checks, the decision on several workload
seeds and the `N + omnigate` rows' verdict. Pure: run documents in, text and verdicts out; the figures the
reasons quote (`doc["physics"]`) come from the simulator's profile (replay.physics).
"""

from __future__ import annotations

import csv
import itertools
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from loadtest.knee import dig
from loadtest.report import fmt
from loadtest.workload import Workload

HERE = Path(__file__).parent / "workloads"
GIB = 1 << 30
VALUES = (8, 16, 32, 48, 64, 128)
SEED_CHOICE = "32"
SEEDS = 5  # the workload's seed and the next four
MIN_AGREEING_SEEDS = 4
TOLERANCE = 0.10  # a rising column may dip by at most this share from one point to the next
FAR = 2.0  # an absolute figure over 2× or under ½ the seed's is "far" and gets its reason printed
GatewayCheck = Literal["report", "enforce"]
PROTOCOL = (
    "protocol: the same open-loop seed load per point, offered through an outer in-flight cap = the "
    "point's cap (client-held time = outer wait); TTFT and queue P99 are engine-side (scraped "
    "histograms), TPOT client-side, tok/s = generated tokens/s, memory = GPU memory in use (GiB). "
    "'N + omnigate': no harness cap, `omnigate serve` with policies/default.yaml in front of the engine "
    "at N (outer wait = the gateway's queue time)."
)


def memory_gib(res: dict[str, Any]) -> float | None:
    return value(res, "backend.memory_bytes.peak", 1 / GIB)


def outer_wait_p99(res: dict[str, Any]) -> float | None:
    """The outer layer's hold: the harness's cap, or the gateway's queue (x-omnigate-queue-ms)."""
    return dig(res, "summary.outer_wait_ms.p99") or dig(res, "summary.queue_ms.p99")


def oom(res: dict[str, Any]) -> bool:
    return bool(dig(res, "oom.detected"))


def value(res: dict[str, Any], path: str, scale: float = 1.0) -> float | None:
    v = dig(res, path)
    return None if v is None else v * scale


# The seed's columns: (name, where the run document holds ours, the seed CSV's column, digits, scale).
COLUMNS: list[tuple[str, str, str, int, float]] = [
    ("tok/s", "summary.output_throughput", "tokens_per_s", 0, 1.0),
    ("TTFT P99", "backend.engine_ttft_ms.p99", "ttft_p99_ms", 0, 1.0),
    ("TPOT P50", "summary.tpot_ms.p50", "tpot_p50_ms", 1, 1.0),
    ("TPOT P99", "summary.tpot_ms.p99", "tpot_p99_ms", 1, 1.0),
    ("queue P99", "backend.engine_queue_ms.p99", "queue_p99_ms", 0, 1.0),
    ("mem GB", "backend.memory_bytes.peak", "memory_peak_gb", 1, 1 / GIB),
]


def why_far(name: str, f: dict[str, float]) -> str:
    """Why a column of ours is far from the seed's, from the profile's physics (empty: no known reason)."""
    prefill = f"{f['prefill_2k_s']:.2f}–{f['prefill_4k_s']:.2f} s"
    return {
        "TTFT P99": f"one A100 prefills a 2–4-image prompt (2–4 k tokens) in {prefill}; the seed's 220 ms "
        "at cap 8 needs about twice that speed (it ran on 2 GPUs)",
        "TPOT P50": f"a decode step of 8 sequences takes {f['decode_8_ms']:.1f} ms here (one read of the "
        "weights); the seed's flat 26–28 ms from cap 8 to 48 is a ~2.7× costlier step (a larger model, "
        "or tensor parallelism's all-reduces)",
        "TPOT P99": "the tail is prefill stalls spread over short answers; our faster decode steps make "
        "the same stall a smaller share of a request's time",
        "queue P99": "the engine queue is the wait for a prefill step: at cap 8 a request arrives only "
        "when a slot frees and waits at most for the step in flight, from 16 on it waits behind "
        f"multimodal prefills of {prefill} each (see TTFT)",
        "mem GB": f"memory in use = {f['static_gib']:.1f} GiB static ({f['weights_gib']:.1f} GiB of thinker "
        f"and encoder weights, context, CUDA graphs) + {f['cell_kib']:.0f} KiB per cached token + "
        "activations; the seed's 38 GB at cap 8 implies ~33 GB static and +0.68 GB per running slot "
        f"({0.68e9 / (f['cell_kib'] * 1024) / 1000:.0f} k tokens at our cell, far more than this mix "
        "holds per request)",
    }.get(name, "")


def seed_table(path: Path = HERE / "seed_table.csv") -> dict[str, dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return {row["batch_cap"]: row for row in csv.DictReader(f)}


def seed_value(seed: dict[str, dict[str, str]], cap: str, key: str) -> float | None:
    raw = seed.get(cap, {}).get(key, "")
    return float(raw) if raw else None


def side_by_side(rows: list[tuple[str, dict[str, Any]]], seed: dict[str, dict[str, str]]) -> str:
    """Every seed column, ours beside the seed's, then the columns only we have."""
    head = ["cap"]
    for name, *_ in COLUMNS:
        head += [name, "seed"]
    head += ["OOM", "seed", "outer wait P99", "shed", "KV peak", "retract"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, res in rows:
        cap = label if label.isdigit() else ""  # the `N + omnigate` rows have no seed twin
        cells = [label]
        for _, path, key, digits, scale in COLUMNS:
            theirs = seed_value(seed, cap, key)
            cells += [fmt(value(res, path, scale), digits), "–" if theirs is None else fmt(theirs, 0)]
        kv = dig(res, "backend.kv_usage.peak")
        seed_oom = seed.get(cap, {}).get("oom")
        cells += [
            "yes" if oom(res) else "no", "–" if seed_oom is None else ("yes" if seed_oom == "true" else "no"),
            fmt(outer_wait_p99(res)), f"{dig(res, 'summary.rejection_rate') or 0.0:.0%}",
            "–" if kv is None else f"{kv:.0%}", fmt(dig(res, "backend.retractions")),
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def rises(values: list[float | None], tolerance: float = TOLERANCE) -> bool:
    """Non-decreasing point by point, each step allowed to dip by `tolerance` (missing points skipped)."""
    known = [v for v in values if v is not None]
    return all(b >= a * (1 - tolerance) for a, b in itertools.pairwise(known))


def flattens(values: list[float], tolerance: float = TOLERANCE) -> bool:
    """Each step's relative gain is at most the previous step's plus `tolerance`."""
    gains = [(b - a) / a for a, b in itertools.pairwise(values) if a > 0]
    return all(g2 <= g1 + tolerance for g1, g2 in itertools.pairwise(gains))


def _series_text(values: list[float | None], digits: int) -> str:
    return " → ".join(fmt(v, digits) for v in values)


def shape_checks(doc: dict[str, Any], seed: dict[str, dict[str, str]]) -> list[tuple[bool, str]]:
    """The acceptance checks. Shapes, point by point, on the median over the workload seeds when the
    document has them (one run's P99 rests on a handful of requests): every column the seed has rising
    rises too (each step may dip by TOLERANCE), throughput flattens, no OOM where the seed had none.
    Then the decision: the recommendation is the seed's, on this run and on most workload seeds."""
    vals, pts = doc["values"], doc["points"]
    spread = doc.get("seeds") or {}
    judged = spread.get("median") or pts
    where = f" (median of {len(spread['per_seed'])} workload seeds)" if spread.get("median") else ""
    checks = []
    for name, path, key, digits, scale in COLUMNS:
        ours = [value(p, path, scale) for p in judged]
        if not rises([seed_value(seed, v, key) for v in vals]):
            continue  # the seed's own column does not rise: nothing to hold ours to
        text = f"{name} rises point by point, no step down > {TOLERANCE:.0%}{where}"
        checks.append((rises(ours), f"{text}: {_series_text(ours, digits)}"))
    thr = [dig(p, "summary.output_throughput") or 0.0 for p in judged]
    checks.append(
        (flattens(thr), f"tok/s flattens: no step gains more than the one before + {TOLERANCE:.0%}{where}")
    )
    for v, p, j in zip(vals, pts, judged, strict=True):
        if seed.get(v, {}).get("oom") == "false":
            checks.append((not oom(p) and not oom(j), f"{v}: no OOM, as the seed"))
    rec = doc["recommendation"]
    checks.append((rec == SEED_CHOICE, f"recommendation {rec} == {SEED_CHOICE}"))
    if spread.get("per_seed"):
        agree = sum(d["recommendation"] == SEED_CHOICE for d in spread["per_seed"])
        text = f"recommendation {SEED_CHOICE} on {agree} of {len(spread['per_seed'])} workload seeds"
        checks.append((agree >= MIN_AGREEING_SEEDS, f"{text} (needs {MIN_AGREEING_SEEDS})"))
    return checks


def distances(doc: dict[str, Any], seed: dict[str, dict[str, str]], f: dict[str, float]) -> list[str]:
    """How far each absolute figure is from the seed's (ours ÷ seed per cap), and why where it is far."""
    out = []
    for name, path, key, _, scale in COLUMNS:
        ratios = []
        for v, p in zip(doc["values"], doc["points"], strict=True):
            ours, theirs = value(p, path, scale), seed_value(seed, v, key)
            ratios.append(None if ours is None or not theirs else ours / theirs)
        text = " ".join("–" if r is None else f"×{r:.2f}" for r in ratios)
        far = any(r is not None and not 1 / FAR <= r <= FAR for r in ratios)
        reason = why_far(name, f) if far else ""
        out.append(f"{name}: {text}" + (f" — far: {reason}" if reason else " — far" if far else ""))
    for v, p in zip(doc["values"], doc["points"], strict=True):
        if seed.get(v, {}).get("oom") == "true" and not oom(p):
            kv = (dig(p, "backend.kv_usage.peak") or 0.0) * f["pool_tokens"]
            out.append(
                f"OOM at {v}: seed yes, ours no — memory in use peaks at {fmt(memory_gib(p), 1)} of "
                f"{f['gpu_gib']:.2f} GiB: the KV pool SGLang derives "
                f"({f['pool_tokens'] / 1000:.0f} k tokens) peaks at {kv / 1000:.0f} k, and a prefill "
                "step's activations (at most one 8 k-token chunk and one request's images) stay within "
                f"the {f['headroom_gib']:.1f} GiB outside the pool"
            )
    return out


def gateway_checks(doc: dict[str, Any]) -> list[tuple[bool, str]]:
    """Each `N + omnigate` row against the debate's answer: TPOT P99 < SLO, no OOM or retraction,
    throughput at least the engine's at the seed's choice (the 32 row)."""
    rows = doc.get("gateway_rows") or []
    if not rows:
        return []
    slo = doc["slo"].get("tpot_ms") or 60.0
    base = dig(doc["points"][doc["values"].index(SEED_CHOICE)], "summary.output_throughput") or 0.0
    checks = []
    for label, res in rows:
        tpot = dig(res, "summary.tpot_ms.p99")
        thr = dig(res, "summary.output_throughput") or 0.0
        retract = dig(res, "backend.retractions") or 0
        checks.append((tpot is not None and tpot < slo, f"{label}: TPOT P99 {fmt(tpot, 1)} ms < {slo:g} ms"))
        checks.append((not oom(res) and retract == 0, f"{label}: no OOM or retraction ({fmt(retract)})"))
        checks.append((thr >= base, f"{label}: tok/s {thr:.0f} ≥ the {SEED_CHOICE} row's {base:.0f}"))
    return checks


def report(doc: dict[str, Any], gateway_check: GatewayCheck = "report") -> int:
    """Print the table, distances, recommendation, seed distribution and checks; 0 when every counted
    check holds (the gateway rows' count only with `gateway_check="enforce"`)."""
    seed = seed_table()
    rows = [(str(v), p) for v, p in zip(doc["values"], doc["points"], strict=True)]
    print(PROTOCOL + "\n")
    print(side_by_side(rows + list(doc.get("gateway_rows") or []), seed))
    print("\nours ÷ seed, per cap:")
    for line in distances(doc, seed, doc["physics"]):
        print(f"  {line}")
    print(f"\nrecommendation (TPOT P99 < 60 ms, {doc['headroom']:.0%} headroom): "
          f"ours {doc['recommendation']}, seed {SEED_CHOICE}; knee: {doc['knee']}")  # fmt: skip
    for reason in doc["rejected"].values():
        print(f"  rejected {reason}")
    spread = doc.get("seeds")
    if spread:
        per_seed = spread["per_seed"]
        counts = Counter(d["recommendation"] for d in per_seed)
        print(
            "by workload seed (engine replayed): " + ", ".join(f"{r}: {n}" for r, n in counts.most_common())
        )
        for d in per_seed:
            tpot = " ".join(f"{fmt(v, 1)}" for v in d["tpot_p99_ms"].values())
            print(f"  seed {d['seed']}: recommendation {d['recommendation']}; TPOT P99 ms by cap {tpot}")
    checks = shape_checks(doc, seed)
    print()
    for ok, text in checks:
        print(f"[{'ok' if ok else 'FAIL'}] {text}")
    gw = gateway_checks(doc)
    if gw:
        mode = "counted" if gateway_check == "enforce" else "reported, not counted (--gateway-check enforce)"
        print(f"\nthe debate settled through the gateway ({mode}):")
        for ok, text in gw:
            print(f"[{'ok' if ok else 'FAIL'}] {text}")
    counted = checks + (gw if gateway_check == "enforce" else [])
    return 0 if all(ok for ok, _ in counted) else 1


def seed_list(w: Workload) -> list[int]:
    return [w.seed + i for i in range(SEEDS)]
