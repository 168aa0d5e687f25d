"""validate-seed: the seed article's batch-cap sweep on the simulator, printed next to the article's table.

The protocol is fixed and is the article's own measurement: each point offers the same open-loop seed
load (workloads/seed.yaml: Poisson arrivals on a sawtooth, 5:3:2 mix) through an outer admission layer
that keeps at most `cap` requests in the engine (the harness's in-flight cap, RunOptions.max_in_flight;
the client holds the rest and reports that time as "outer wait"). TTFT P99 and queue P99 are the
engine's own, from its scraped histograms; TPOT comes from the client; throughput is generated tokens/s.
--max-running-requests goes over 8…128, SLO TPOT P99 < 60 ms with 10 % headroom. The shape checks are
the acceptance criteria of issue 5; a failed check exits 1.
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
from loadtest.report import fmt, markdown
from loadtest.results import build_result
from loadtest.runner import RunOptions, execute
from loadtest.sweep import analyse, sim_target
from loadtest.workload import Workload, load_workload

HERE = Path(__file__).parent / "workloads"
VALUES = (8, 16, 32, 48, 64, 128)
SEED_CHOICE = "32"
PARAM = "max-running-requests"
PROTOCOL = (
    "protocol: the same open-loop seed load per point, offered through an outer in-flight cap = the "
    "point's cap (client-held time = outer wait); TTFT and queue P99 are engine-side (scraped "
    "histograms), TPOT client-side, tok/s = generated tokens/s"
)

COLUMNS = (
    "cap", "tok/s ours", "seed", "Δ", "TTFT P99 engine", "seed", "TPOT P50 ours", "seed", "TPOT P99 ours",
    "seed", "queue P99 engine", "seed", "outer wait P99", "shed", "KV peak ours", "seed mem", "retract",
    "OOM ours", "seed",
)  # fmt: skip


def engine_ttft_p99(res: dict[str, Any]) -> float | None:
    return dig(res, "backend.engine_ttft_ms.p99")


def engine_queue_p99(res: dict[str, Any]) -> float | None:
    return dig(res, "backend.engine_queue_ms.p99")


def seed_table(path: Path = HERE / "seed_table.csv") -> dict[str, dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return {row["batch_cap"]: row for row in csv.DictReader(f)}


def side_by_side(doc: dict[str, Any], seed: dict[str, dict[str, str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for value, res in zip(doc["values"], doc["points"], strict=True):
        row = seed.get(value, {})
        ours = dig(res, "summary.output_throughput")
        theirs = float(row["tokens_per_s"]) if row.get("tokens_per_s") else None
        delta = f"{(ours - theirs) / theirs:+.0%}" if ours is not None and theirs else "–"
        kv = dig(res, "backend.kv_usage.peak")
        mem = f"{row['memory_peak_gb']} GB" if row.get("memory_peak_gb") else "OOM"
        cells = [
            value, fmt(ours), row.get("tokens_per_s", "–"), delta,
            fmt(engine_ttft_p99(res)), row.get("ttft_p99_ms", "–"),
            fmt(dig(res, "summary.tpot_ms.p50"), 1), row.get("tpot_p50_ms", "–"),
            fmt(dig(res, "summary.tpot_ms.p99"), 1), row.get("tpot_p99_ms", "–"),
            fmt(engine_queue_p99(res)), row.get("queue_p99_ms", "–"),
            fmt(dig(res, "summary.outer_wait_ms.p99")), f"{dig(res, 'summary.rejection_rate') or 0.0:.0%}",
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
    q = [engine_queue_p99(p) or 0.0 for p in pts]
    checks.append((q[-1] > q[0], f"engine queue P99 rises with the cap ({q[0]:.0f} → {q[-1]:.0f} ms)"))
    ttft = [engine_ttft_p99(p) or 0.0 for p in pts]
    checks.append(
        (ttft[-1] > ttft[0], f"engine TTFT P99 rises with the cap ({ttft[0]:.0f} → {ttft[-1]:.0f} ms)")
    )
    top = pts[-1]
    exhausted = (dig(top, "backend.retractions") or 0) > 0 or bool(dig(top, "oom.detected"))
    checks.append((exhausted, f"{vals[-1]}: KV pool exhausted (retractions or OOM)"))
    checks.append(
        (doc["recommendation"] == SEED_CHOICE, f"recommendation {doc['recommendation']} == {SEED_CHOICE}")
    )
    return checks


def report(doc: dict[str, Any]) -> int:
    """Print the side-by-side table, the recommendation and the shape checks; 0 when every check holds."""
    seed = seed_table()
    print(PROTOCOL + "\n")
    print(side_by_side(doc, seed))
    print(f"\nrecommendation (TPOT P99 < 60 ms, 10 % headroom): ours {doc['recommendation']}, "
          f"seed {SEED_CHOICE}; knee: {doc['knee']}")  # fmt: skip
    for reason in doc["rejected"].values():
        print(f"  rejected {reason}")
    checks = shape_checks(doc, seed)
    print()
    for ok, text in checks:
        print(f"[{'ok' if ok else 'FAIL'}] {text}")
    return 0 if all(ok for ok, _ in checks) else 1


def seed_workload(duration: float | None = None, time_scale: float | None = None) -> Workload:
    overrides: dict[str, Any] = {}
    if duration is not None:
        overrides["duration"] = duration
    if time_scale is not None:
        overrides["time_scale"] = time_scale
    return load_workload(HERE / "seed.yaml", overrides)


async def sweep(w: Workload, ladder: list[str]) -> dict[str, Any]:
    """One simulator per point; the outer in-flight cap follows the point's --max-running-requests."""
    target = sim_target(PARAM, ["--profile", "default", "--seed", str(w.seed)], w.time_scale)
    results = []
    for value in ladder:
        async with target(value) as ep:
            opts = RunOptions(url=ep.url, workload=w, scrape_targets=ep.scrape, max_in_flight=int(value))
            records, samples = await execute(opts)
            res = build_result(records, samples, opts)
        res["meta"].update(param=PARAM, value=value, max_in_flight=int(value))
        results.append(res)
        print(f"  point {value} done", file=sys.stderr)
    return analyse(PARAM, ladder, results, w.slo.model_dump(), headroom=0.1)


def validate(values: str, duration: float | None, time_scale: float | None, out: Path | None) -> int:
    w = seed_workload(duration, time_scale)
    ladder = [v.strip() for v in values.split(",") if v.strip()]
    per_point = (w.duration + w.warmup.duration) / w.time_scale
    print(f"validate-seed: {len(ladder)} points × ~{per_point:.0f} s", file=sys.stderr)
    doc = asyncio.run(sweep(w, ladder))
    code = report(doc)
    if out is not None:
        html.write_outputs(doc, out, markdown(doc))
    return code
