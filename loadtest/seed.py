"""validate-seed: the seed article's batch-cap sweep on the simulator, printed next to the article's table.

The protocol is fixed (workloads/seed.yaml, --max-running-requests over 8…128, SLO TPOT P99 < 60 ms,
10 % headroom); the shape checks are the acceptance criteria of issue 5. A failed check exits 1.
"""

from __future__ import annotations

import asyncio
import csv
import itertools
import sys
from pathlib import Path
from typing import Any

from loadtest import html
from loadtest.knee import dig
from loadtest.report import fmt, markdown, queue_p99
from loadtest.runner import RunOptions
from loadtest.sweep import run_sweep, sim_target
from loadtest.workload import load_workload

HERE = Path(__file__).parent / "workloads"
VALUES = (8, 16, 32, 48, 64, 128)
SEED_CHOICE = "32"


def seed_table(path: Path = HERE / "seed_table.csv") -> dict[str, dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return {row["batch_cap"]: row for row in csv.DictReader(f)}


def side_by_side(doc: dict[str, Any], seed: dict[str, dict[str, str]]) -> str:
    head = (
        "| cap | tok/s ours | seed | Δ | TTFT P99 ours | seed | TPOT P50 ours | seed | TPOT P99 ours | seed "
    )
    head += "| queue P99 ours | seed | KV peak ours | seed mem | retract | OOM ours | seed |"
    lines = [head, "|" + "---|" * 17]
    for value, res in zip(doc["values"], doc["points"], strict=True):
        row = seed.get(value, {})
        ours = dig(res, "summary.output_throughput")
        theirs = float(row["tokens_per_s"]) if row.get("tokens_per_s") else None
        delta = f"{(ours - theirs) / theirs:+.0%}" if ours is not None and theirs else "–"
        kv = dig(res, "backend.kv_usage.peak")
        mem = f"{row['memory_peak_gb']} GB" if row.get("memory_peak_gb") else "OOM"
        cells = [
            value, fmt(ours), row.get("tokens_per_s", "–"), delta,
            fmt(dig(res, "summary.ttft_ms.p99")), row.get("ttft_p99_ms", "–"),
            fmt(dig(res, "summary.tpot_ms.p50"), 1), row.get("tpot_p50_ms", "–"),
            fmt(dig(res, "summary.tpot_ms.p99"), 1), row.get("tpot_p99_ms", "–"),
            fmt(queue_p99(res)), row.get("queue_p99_ms", "–"),
            "–" if kv is None else f"{kv:.0%}", mem,
            fmt(dig(res, "backend.retractions")), "yes" if dig(res, "oom.detected") else "no",
            "yes" if row.get("oom") == "true" else "no",
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def shape_checks(doc: dict[str, Any], seed: dict[str, dict[str, str]]) -> list[tuple[bool, str]]:
    """The acceptance checks of the calibration, each with a readable verdict."""
    vals, pts = doc["values"], doc["points"]
    thr = [dig(p, "summary.output_throughput") or 0.0 for p in pts]
    tpot99 = [dig(p, "summary.tpot_ms.p99") for p in pts]
    checks = []
    for v, t in zip(vals, thr, strict=True):
        ref = float(seed[v]["tokens_per_s"]) if v in seed else None
        if ref:
            checks.append((abs(t - ref) / ref <= 0.25, f"{v}: throughput {t:.0f} within ±25 % of {ref:.0f}"))
    checks.append(
        (all(b >= a * 0.97 for a, b in itertools.pairwise(thr)), "throughput rises (non-decreasing)")
    )
    if len(thr) >= 3:
        first, last = thr[1] - thr[0], thr[-1] - thr[-2]
        checks.append((last < first, "throughput flattens (last step gains less than the first)"))
    for v, t in zip(vals, tpot99, strict=True):
        low = int(v) <= 32
        ok = t is not None and (t < 60 if low else t > 60)
        checks.append((ok, f"{v}: TPOT P99 {fmt(t, 1)} ms {'<' if low else '>'} 60 ms"))
    q = [queue_p99(p) or 0.0 for p in pts]
    checks.append((q[-1] > q[0], f"queue P99 rises with the cap ({q[0]:.0f} → {q[-1]:.0f} ms)"))
    ttft = [dig(p, "summary.ttft_ms.p99") or 0.0 for p in pts]
    checks.append((ttft[-1] > ttft[0], f"TTFT P99 rises with the cap ({ttft[0]:.0f} → {ttft[-1]:.0f} ms)"))
    top = pts[-1]
    exhausted = (dig(top, "backend.retractions") or 0) > 0 or bool(dig(top, "oom.detected"))
    checks.append((exhausted, f"{vals[-1]}: KV pool exhausted (retractions or OOM)"))
    checks.append(
        (doc["recommendation"] == SEED_CHOICE, f"recommendation {doc['recommendation']} == {SEED_CHOICE}")
    )
    return checks


def validate(values: str, duration: float | None, time_scale: float | None, out: Path | None) -> int:
    overrides: dict[str, Any] = {}
    if duration is not None:
        overrides["duration"] = duration
    if time_scale is not None:
        overrides["time_scale"] = time_scale
    w = load_workload(HERE / "seed.yaml", overrides)
    opts = RunOptions(url="http://127.0.0.1", workload=w)
    ladder = [v.strip() for v in values.split(",") if v.strip()]
    target = sim_target("max-running-requests", ["--profile", "default", "--seed", str(w.seed)], w.time_scale)
    per_point = (w.duration + w.warmup.duration) / w.time_scale
    print(f"validate-seed: {len(ladder)} points × ~{per_point:.0f} s", file=sys.stderr)
    sweep = run_sweep(
        opts, "max-running-requests", ladder, target, headroom=0.1,
        on_point=lambda v, r: print(f"  point {v} done", file=sys.stderr),
    )  # fmt: skip
    doc = asyncio.run(sweep)
    seed = seed_table()
    print(side_by_side(doc, seed))
    print(f"\nrecommendation (TPOT P99 < 60 ms, 10 % headroom): ours {doc['recommendation']}, "
          f"seed {SEED_CHOICE}; knee: {doc['knee']}")  # fmt: skip
    for reason in doc["rejected"].values():
        print(f"  rejected {reason}")
    checks = shape_checks(doc, seed)
    print()
    for ok, text in checks:
        print(f"[{'ok' if ok else 'FAIL'}] {text}")
    if out is not None:
        html.write_outputs(doc, out, markdown(doc))
    return 0 if all(ok for ok, _ in checks) else 1
