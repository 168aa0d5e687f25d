"""Scheduling on traffic nobody tuned for: a seeded family of workloads (issue 39).

    .venv/bin/python -m bench.family --quick                     # 2 workloads, a few minutes
    .venv/bin/python -m bench.family                             # 10 workloads, about 25 minutes
    .venv/bin/python -m bench.family --seeds 1234567,2345678     # the workloads of an earlier run again
    .venv/bin/python -m bench.family --quick --ablate            # each admission mechanism off in turn

Each workload is drawn from a seed (`bench/common/workload_family.py`): modality shares (text, one image, 2–4
images, audio in, long documents; the simulated SGLang pool does not speak, so no speech out), prompt and
answer length distributions, a constant or sawtooth rate at 0.5×–2.5× its engine's modelled capacity with
Poisson or burstier gamma gaps, an engine cap of 32–256 and one to three tenants (some with a share of
top-band requests). Report seeds are drawn fresh each run and printed; seeds below 1 000 000 are the
tuning set (`--tuning`), so a report never runs a workload anyone tuned on.

Every workload runs against its own simulated engine (bench/scheduling.py's house: the same time scale,
policy scaling and SLO — TTFT 2 s, TPOT 60 ms): clients going direct, a fixed-limit sweep, the adaptive
policy. Goodput is requests in SLO per simulated second of the measured phase. A fixed limit is a
baseline only when its TPOT P99 ≤ 0.9 × the objective. Printed: the distribution (median, worst decile,
worst) of adaptive ÷ best qualifying fixed, adaptive ÷ direct, SLO attainment, TPOT P99 ÷ objective, the
share refused and the in-SLO share per modality bucket; issue 39's targets with verdicts; the early
rejection's calibration (the first token it predicted for admitted requests, `x-omnigate-predicted-ttft-ms`,
against their TTFT) and its counterfactual (refused requests replayed with admission forced).

The counterfactual counts as honest by construction a refusal whose request, sent to the engine at the
refusal and prefilled at the engine's nominal rate, would still have been late (its `x-omnigate-slack-ms`
is negative); the share of all deadline refusals that would have met their deadline is estimated as the
others' share times the share of probed ones that met it. Of the others it replays the adaptive run with
the same seeds, sending up to `--probes` (at least `--probe-spacing` simulated seconds apart, so one forced
request hardly loads the next) in a policy class `probe` that is the interactive class without deadline
shedding (adaptive LIFO orders it where the refused request would have gone); a probe met its deadline
when it was answered with its first token within the TTFT objective. Timing on a shared box differs
between the run and its replay, so the rest of the replay is not the same run to the request: a probe
judges a similar queue, not the same one.

`--ablate` adds, per workload, the unchanged adaptive policy twice more (three unchanged runs: their range
is the run-to-run spread) and one run per admission mechanism switched off by its policy key, and prints
each one's Δ of adaptive ÷ best fixed at the median and in the worst decile against that spread, with its
TPOT P99 ÷ objective and share refused.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common.args import comma_list
from bench.common.servers import ROOT, Procs
from bench.common.workload_family import (
    REPORT_SEEDS_FROM,
    Outcome,
    arrivals,
    capacity,
    content,
    draw,
    figures,
    spread,
    targets,
)
from bench.scheduling import TPOT_SLO_S, TTFT_SLO_S, House, Stream, measured, run, workload
from gateway.livepolicy.policy import Policy, load_policy
from loadtest.metrics import percentile
from loadtest.records import RequestRecord
from loadtest.sim.profile import load_profile

PROBE_CLASS = "probe"
ABLATIONS: dict[str, dict[str, Any]] = {
    "metered rounds (and with them the duty)": {"budgets": {"prefill_rate_fraction": None}},
    "duty (held at 1)": {"controller": {"duty": False}},
    "shield (and with it the spacing)": {"budgets": {"shield": {"tokens": None}}},
    "spacing": {"budgets": {"shield": {"duty": None}}},
    "standing (and the tenant headroom)": {"fairness": {"reserve_fraction": 0.0}},
    "adaptive LIFO": {"queue": {"lifo_after_fraction": None}},
    "calibrated wait of a refusal": {"queue": {"refusal_confidence": None}},
    "band reserve": {"queue": {"priorities": {"reserve_fraction": 0.0}}},
    "limit steering (gain ≈ 0: the limit stays at its initial 32)": {"controller": {"gain": 1e-9}},
    "tail shape (aim the P90 at headroom)": {"controller": {"tail_shape": False}},
}
NOT_EXERCISED = {"lending": "one pool per workload: nothing to lend"}
AGAIN = ("adaptive again", "adaptive a third time")


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` written into it, nested mappings merged key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def with_probe_class(policy: Policy) -> Policy:
    """The policy plus class `probe`: the interactive class on its pool, never shed by deadline."""
    doc = policy.model_dump(mode="json")
    classes = doc["queue"]["classes"]
    classes[PROBE_CLASS] = {**classes["interactive"], "shed_by_deadline": False, "pool": "interactive"}
    return Policy.model_validate(doc)


def variant(policy: Policy, over: dict[str, Any]) -> tuple[Policy, dict[str, Any]]:
    """(policy, controller overrides) of an ablation: the controller's keys go through House.gateway, so
    the time scaling of the rest still applies."""
    rest = {k: v for k, v in over.items() if k != "controller"}
    return Policy.model_validate(merged(policy.model_dump(mode="json"), rest)), over.get("controller", {})


def settings(args: argparse.Namespace, cap: int) -> list[tuple[str, dict[str, Any] | None]]:
    """(name, policy overrides or None for direct) of every run of one workload, in order."""
    out: list[tuple[str, dict[str, Any] | None]] = [("direct", None)]
    for n in sorted({min(n, cap) for n in args.sweep}):
        out.append((f"fixed {n}", {"controller": {"algorithm": "fixed", "initial": n, "min": n, "max": n}}))
    out.append(("adaptive", {}))
    if args.ablate:
        out += [(name, {}) for name in AGAIN]
        out += [(f"− {name}", over) for name, over in ABLATIONS.items()]
    return out


def probes(refused: list[tuple[int, float]], n: int, spacing: float, seed: int) -> list[int]:
    """Up to `n` of the refused (index, send time) at least `spacing` apart, picked at random."""
    rng = random.Random(seed)
    picked: list[tuple[int, float]] = []
    for i, at in rng.sample(refused, len(refused)):
        if len(picked) == n:
            break
        if all(abs(at - other) >= spacing for _, other in picked):
            picked.append((i, at))
    return sorted(i for i, _ in picked)


class Family:
    """Runs the workloads; keeps their outcomes, the adaptive runs' records and the probes' fates."""

    def __init__(self, procs: Procs, args: argparse.Namespace) -> None:
        self.procs, self.args = procs, args
        self.policy = with_probe_class(load_policy(args.policy))
        self.profile = load_profile("default")
        self.outcomes: list[Outcome] = []
        self.admitted: list[RequestRecord] = []  # the adaptive runs' measured records
        # (workload seed, the refused request's record, the same request's when forced in)
        self.probed: list[tuple[int, RequestRecord, RequestRecord]] = []
        self.refused: list[RequestRecord] = []  # the adaptive runs' deadline refusals

    async def workload(self, seed: int) -> Outcome:
        args, d = self.args, draw(seed)
        house = House(self.procs, args.time_scale, 1, self.policy, ["--max-running-requests", str(d.cap)])
        try:
            cap = capacity(workload(args, "family", **content(d)), d.cap, self.profile, TPOT_SLO_S)
            over = {**content(d), **arrivals(d, cap, args.duration)}
            outcome = Outcome(d, cap)
            print(f"\n## {d.label()}; capacity {cap:.2f} req/s", flush=True)
            for name, setting in settings(args, d.cap):
                s = Stream(name, workload(args, "family", **over))
                await self._run(house, name, setting, s)
                outcome.runs[name] = figures(measured(s), s.workload.slo, args.duration)
                f = outcome.runs[name]
                print(
                    f"  {name}: goodput {f.goodput:.2f}, attainment {f.attainment:.1%}, TPOT P99 ÷ objective "
                    f"{f.tpot_p99_ratio or float('nan'):.2f}, refused {f.refused_share:.1%}",
                    flush=True,
                )
                if name == "adaptive":
                    self.admitted += measured(s)
                    await self._counterfactual(house, seed, s, over)
            return outcome
        finally:
            for i in range(len(house.sims)):
                proc = self.procs.procs.pop(f"sim{i}")
                proc.terminate()
                proc.wait(10)

    async def _run(self, house: House, name: str, setting: dict[str, Any] | None, s: Stream) -> None:
        if setting is None:
            await run(house, house.sims[0], [s])
            return
        house.policy, controller = variant(self.policy, setting)
        gw_name = "gw-" + "".join(ch if ch.isalnum() else "-" for ch in name)
        gw = house.gateway(gw_name, controller)
        try:
            await run(house, gw, [s])
        finally:
            house.stop(gw_name, gw)
            house.policy = self.policy

    async def _counterfactual(self, house: House, seed: int, adaptive: Stream, over: dict[str, Any]) -> None:
        """Replay the adaptive run with some of its `slo_unattainable` refusals sent in the probe class —
        only those that could have met the deadline sent at once (`honest_by_construction`: the others
        could not, whatever the queue)."""
        records = measured(adaptive)
        self.refused += [r for r in records if r.error == "slo_unattainable"]
        refused = [
            (i, r.scheduled)
            for i, r in enumerate(records)
            if r.error == "slo_unattainable" and not honest_by_construction(r)
        ]
        picked = probes(refused, self.args.probes, self.args.probe_spacing, seed)
        if not picked:
            return
        replay = Stream(
            "counterfactual",
            workload(self.args, "family", **over),
            headers_at={i: {"x-omnigate-class": PROBE_CLASS} for i in picked},
        )
        await self._run(house, "counterfactual", {}, replay)
        again = measured(replay)
        self.probed += [(seed, records[i], again[i]) for i in picked]
        met = sum(met_deadline(again[i]) for i in picked)
        print(f"  counterfactual: {met} of {len(picked)} refusals forced in met the deadline", flush=True)


def met_deadline(r: RequestRecord) -> bool:
    return r.ok and r.ttft is not None and r.ttft <= TTFT_SLO_S


def honest_by_construction(r: RequestRecord) -> bool:
    """A deadline refusal made when the request, sent to the engine at once and prefilled at its nominal
    rate, would still have missed the deadline (the refusal's `x-omnigate-slack-ms` is negative)."""
    slack = r.slack_ms
    return slack is not None and slack < 0


AT_ONCE_S = 0.25
"""A refusal answered within this many simulated seconds of its send was made at admission; a later one
by a sweep of the queue while the request waited."""


def refused_at(r: RequestRecord) -> float:
    """Simulated seconds from the send to the refusal."""
    return r.e2e if r.e2e is not None else 0.0


# -- report ---------------------------------------------------------------------------------------------
def _f(v: float | None, spec: str = ".2f") -> str:
    return "—" if v is None else format(v, spec)


def report(fam: Family, seeds: list[int], wall_s: float) -> list[str]:
    args, outcomes = fam.args, fam.outcomes
    tuning = any(s < REPORT_SEEDS_FROM for s in seeds)
    out = [
        f"\n# family — {len(outcomes)} workloads, {args.duration:g} simulated s each, time scale "
        f"{args.time_scale:g}, fixed sweep {','.join(map(str, args.sweep))} (≤ each engine's cap)",
        f"seeds: --seeds {','.join(map(str, seeds))}" + (" (TUNING seeds: not a report)" if tuning else ""),
        "",
        "| seed | cap | load | capacity r/s | best qualifying fixed | adaptive ÷ best fixed "
        "| adaptive ÷ direct | attainment direct / best / adaptive "
        "| TPOT P99 ÷ obj. direct / best / adaptive | refused best / adaptive |",
        "|---|---:|---:|---:|---|---:|---:|---|---|---|",
    ]
    for o in outcomes:
        best = o.best_fixed()
        rows = [o.runs["direct"], *([o.runs[best]] if best else []), o.runs["adaptive"]]
        att = " / ".join(f"{f.attainment:.0%}" for f in rows)
        tp = " / ".join(_f(f.tpot_p99_ratio) for f in rows)
        ref = " / ".join(f"{f.refused_share:.0%}" for f in rows[1:])
        out.append(
            f"| {o.draw.seed} | {o.draw.cap} | {o.draw.load:.2f}× | {o.capacity:.2f} | {best or 'none'} "
            f"| {_f(o.ratio('adaptive', best))} | {_f(o.ratio('adaptive', 'direct'))} "
            f"| {att} | {tp} | {ref} |"
        )
    out += ["", *(f"- {o.draw.label()}" for o in outcomes)]
    out += ["", "Distribution over the workloads (median / worst decile / worst):", ""]
    out += ["| figure | median | worst decile | worst | n |", "|---|---:|---:|---:|---:|"]

    def line(name: str, values: list[float | None], higher: bool = True) -> None:
        s = spread(values, higher)
        if s is not None:
            out.append(f"| {name} | {s.median:.3f} | {s.decile:.3f} | {s.worst:.3f} | {s.n} |")
        else:
            out.append(f"| {name} | — | — | — | 0 |")

    line("adaptive ÷ best qualifying fixed", [o.ratio("adaptive", o.best_fixed()) for o in outcomes])
    line("adaptive ÷ direct", [o.ratio("adaptive", "direct") for o in outcomes])
    for who in ("direct", "adaptive"):
        line(f"SLO attainment, {who}", [o.runs[who].attainment for o in outcomes])
        line(f"TPOT P99 ÷ objective, {who}", [o.runs[who].tpot_p99_ratio for o in outcomes], higher=False)
    line("share refused, adaptive", [o.runs["adaptive"].refused_share for o in outcomes], higher=False)
    for bucket in sorted({b for o in outcomes for b in o.draw.mix}):
        line(f"{bucket} in SLO, adaptive", [o.runs["adaptive"].in_slo(bucket) for o in outcomes])
        fixed = [o.runs[b].in_slo(bucket) if (b := o.best_fixed()) else None for o in outcomes]
        line(f"{bucket} in SLO, best qualifying fixed", fixed)
    none = sum(o.best_fixed() is None for o in outcomes)
    if none:
        out.append(
            f"\nNo fixed limit qualified on {none} of {len(outcomes)} workloads (excluded from ÷ fixed)."
        )
    out += ["", "Issue 39's targets (adaptive):", ""]
    for t in targets(outcomes):
        mark = "—" if t.held is None else ("PASS" if t.held else "MISS")
        out.append(f"- {mark} {t.name}: {t.detail}")
    out += calibration(fam)
    if args.ablate:
        out += ablation(outcomes)
    out.append(f"\nwall time {wall_s:.0f} s")
    return out


def calibration(fam: Family) -> list[str]:
    """Predicted first token at admission vs the TTFT the client saw, per bucket; the counterfactual."""
    pairs = [
        (r.bucket, r.ttft * 1000 - p)
        for r in fam.admitted
        if r.ok and r.ttft is not None and (p := r.predicted_ttft_ms) is not None
    ]
    out = [
        "",
        "Early rejection — calibration on admitted requests (TTFT − predicted first token, simulated ms):",
        "",
        "| bucket | admitted | median error | P90 of |error| |",
        "|---|---:|---:|---:|",
    ]
    for bucket in [*sorted({b for b, _ in pairs}), "all"]:
        errs = [e for b, e in pairs if bucket in (b, "all")]
        if errs:
            p90 = percentile([abs(e) for e in errs], 90)
            out.append(f"| {bucket} | {len(errs)} | {statistics.median(errs):+.0f} | {p90:.0f} |")
    met = sum(met_deadline(r) for _, _, r in fam.probed)
    n = len(fam.probed)
    honest = sum(map(honest_by_construction, fam.refused))
    others = len(fam.refused) - honest
    share = met / n * others / len(fam.refused) if n else None  # the honest by construction met none
    verdict = "—" if share is None else ("PASS" if share < 0.05 else "MISS")
    out.append(
        f"\nCounterfactual: of {len(fam.refused)} deadline refusals, {honest} were honest by construction "
        f"(late even sent at once at the engine's nominal prefill rate); of the other {others}, {n} were "
        f"replayed with admission forced and {met} met their deadline ({_f(met / n if n else None, '.0%')}). "
        f"Refusals estimated to have met their deadline: {_f(share, '.1%')} of all "
        f"({others} ÷ {len(fam.refused)} × {met} ÷ {n}); {verdict} target < 5 %. The replay runs on a real "
        "clock: its queue diverges from the run's, so a probe judges a similar queue, not the same one."
    )
    for when, at_once in (("at admission", True), ("while waiting", False)):
        these = [r for _, refused, r in fam.probed if (refused_at(refused) <= AT_ONCE_S) == at_once]
        if these:
            met_here = sum(map(met_deadline, these))
            out.append(f"- refused {when}: {met_here} of {len(these)} met the deadline forced in")
    return out


def ablation(outcomes: list[Outcome]) -> list[str]:
    """Each mechanism off: Δ of adaptive ÷ best fixed at the median and worst decile from the mean of the
    unchanged policy's runs, against their range (the run-to-run spread); beside it the TPOT P99 ÷
    objective (median / worst decile) and the median share refused, so a mechanism that protects the
    tail without moving goodput shows."""

    def dist(setting: str) -> Any:
        return spread(o.ratio(setting, o.best_fixed()) for o in outcomes if setting in o.runs)

    def guard(setting: str) -> str:
        runs = [o.runs[setting] for o in outcomes if setting in o.runs]
        tpot = spread((f.tpot_p99_ratio for f in runs), higher_is_better=False)
        refused = spread((f.refused_share for f in runs), higher_is_better=False)
        tail = f"{tpot.median:.2f} / {tpot.decile:.2f}" if tpot else "—"
        return f"{tail} | {_f(refused.median if refused else None, '.1%')}"

    unchanged = [(name, s) for name in ("adaptive", *AGAIN) if (s := dist(name)) is not None]
    out = ["", "Ablation — adaptive ÷ best qualifying fixed with each mechanism off:", ""]
    if len(unchanged) < 2:
        return [*out, "fewer than two unchanged runs with a qualifying fixed limit: nothing to compare"]
    medians, deciles = [s.median for _, s in unchanged], [s.decile for _, s in unchanged]
    noise_m, noise_d = max(medians) - min(medians), max(deciles) - min(deciles)
    mean_m, mean_d = statistics.fmean(medians), statistics.fmean(deciles)
    out += [
        "unchanged policy (median, worst decile): "
        + "; ".join(f"{name} {s.median:.3f}, {s.decile:.3f}" for name, s in unchanged)
        + f" (Δ from their mean; spread {noise_m:.3f}, {noise_d:.3f})",
        "",
        "| mechanism off | median | Δ median | worst decile | Δ worst decile | beyond the spread "
        "| TPOT P99 ÷ obj. median / worst decile | refused (median) |",
        "|---|---:|---:|---:|---:|---|---|---:|",
        *(
            f"| (unchanged: {name}) | {s.median:.3f} | | {s.decile:.3f} | | | {guard(name)} |"
            for name, s in unchanged
        ),
    ]
    for name in ABLATIONS:
        s = dist(f"− {name}")
        if s is None:
            continue
        dm, dd = s.median - mean_m, s.decile - mean_d
        worse = dm < -noise_m or dd < -noise_d
        better = dm > noise_m or dd > noise_d
        word = "worse without it" if worse else ("better without it" if better else "within the spread")
        row = f"| {name} | {s.median:.3f} | {dm:+.3f} | {s.decile:.3f} | {dd:+.3f} | {word}"
        out.append(f"{row} | {guard(f'− {name}')} |")
    out += [f"| {name} | — | — | — | — | not exercised: {why} | | |" for name, why in NOT_EXERCISED.items()]
    return out


# -- main -----------------------------------------------------------------------------------------------
async def main_async(args: argparse.Namespace) -> tuple[Family, list[str]]:
    seeds = args.seeds or (
        list(range(args.workloads))
        if args.tuning
        else [random.SystemRandom().randrange(REPORT_SEEDS_FROM, 2**31) for _ in range(args.workloads)]
    )
    print(f"family seeds: --seeds {','.join(map(str, seeds))}", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="omnigate-family-") as tmp:
        procs = Procs(Path(tmp))
        try:
            fam = Family(procs, args)
            for seed in seeds:
                fam.outcomes.append(await fam.workload(seed))
        finally:
            procs.close()
    lines = report(fam, seeds, time.monotonic() - started)
    print("\n".join(lines), flush=True)
    return fam, lines


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 workloads of 30 simulated s, sweep 16,32")
    ap.add_argument("--workloads", type=int, help="workloads to draw (default 10; --quick 2)")
    ap.add_argument("--seeds", type=comma_list(int), help="run these workloads (a printed run's seeds)")
    ap.add_argument("--tuning", action="store_true", help="draw from the tuning seeds 0, 1, … (not a report)")
    ap.add_argument("--duration", type=float, help="simulated seconds per run (default 120; --quick 30)")
    ap.add_argument("--sweep", type=comma_list(int), help="fixed limits (default 16,32,48; --quick 16,32)")
    ap.add_argument("--probes", type=int, default=10, help="refusals forced in per workload's replay")
    ap.add_argument("--probe-spacing", type=float, default=3.0, help="simulated s between two probes")
    ap.add_argument("--ablate", action="store_true", help="each admission mechanism off in turn")
    ap.add_argument("--time-scale", type=float, default=6.0)
    ap.add_argument("--drain", type=float, default=20.0, help="simulated s to finish after the last send")
    ap.add_argument("--policy", type=Path, default=ROOT / "policies" / "default.yaml")
    args = ap.parse_args(argv)
    quick = args.quick
    args.workloads = args.workloads or (2 if quick else 10)
    args.duration = args.duration or (30.0 if quick else 120.0)
    args.sweep = args.sweep or ([16, 32] if quick else [16, 32, 48])
    if args.seeds and args.tuning:
        ap.error("--seeds and --tuning exclude each other")
    return args


def main() -> None:
    asyncio.run(main_async(parse()))


if __name__ == "__main__":
    main()
