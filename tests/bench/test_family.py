"""bench/family.py: the drawn workloads, the figures and targets computed from runs, and one tiny run of the
whole benchmark against simulated engines (its report's structure, its figures taken from its runs)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import types
from typing import cast

import pytest

from bench import family
from bench.common.workload_family import (
    REPORT_SEEDS_FROM,
    Figures,
    Outcome,
    capacity,
    content,
    draw,
    figures,
    spread,
    targets,
)
from bench.scheduling import TPOT_SLO_S, workload
from loadtest.records import RequestRecord
from loadtest.sim.profile import load_profile
from loadtest.workload import Slo

SLO = Slo(ttft_ms=2000, tpot_ms=60)


def test_a_seed_draws_the_same_workload_within_the_family_ranges() -> None:
    for seed in (0, 7, REPORT_SEEDS_FROM + 12345):
        d = draw(seed)
        assert d == draw(seed)
        assert 0.5 <= d.load <= 2.5 and 32 <= d.cap <= 256 and 1 <= len(d.tenants) <= 3
        assert set(d.mix) <= {"text", "single_image", "multi_image", "audio", "long_doc"} and "text" in d.mix
        assert math.isclose(sum(s for _, s in d.tenants), 1.0)
    assert draw(1) != draw(2)


def test_the_capacity_model_meets_the_scheduling_bench_mixes_measured_at_cap_64() -> None:
    """bench/scheduling.py reads 5.0 (seed mix) and 2.5 (multi-image) req/s off its direct runs at cap 64;
    the model gives 4.9 and 2.2, and a smaller cap serves less."""
    import argparse

    args = argparse.Namespace(duration=60.0, time_scale=6.0, drain=20.0)
    profile = load_profile("default")
    seed_mix = workload(args, "seed", mix={"text": 5, "single_image": 3, "multi_image": 2})
    multi = workload(args, "multi", mix={"text": 1, "single_image": 1, "multi_image": 8})
    at64 = capacity(seed_mix, 64, profile, TPOT_SLO_S)
    assert 4.5 < at64 < 5.5
    assert 2.0 < capacity(multi, 64, profile, TPOT_SLO_S) < 2.5
    assert capacity(seed_mix, 32, profile, TPOT_SLO_S) < at64


def _rec(bucket: str, *, tpot_s: float = 0.03, status: int = 200, ttft: float = 0.5) -> RequestRecord:
    rec = RequestRecord(bucket=bucket, status=status, output_tokens=11)
    if status == 200:
        rec.ttft, rec.e2e = ttft, ttft + 10 * tpot_s
    else:
        rec.error = "slo_unattainable"
    return rec


def test_figures_count_the_slo_refusals_and_the_tpot_tail_per_bucket() -> None:
    recs = [
        _rec("text"),
        _rec("text", tpot_s=0.066),  # TPOT 66 ms: out of SLO, the P99 of the two answers
        _rec("text", status=429),
        _rec("audio", ttft=2.5),  # TTFT over 2 s
    ]
    f = figures(recs, SLO, duration=10.0)
    assert (f.sent, f.good, f.refused) == (4, 1, 1)
    assert (f.goodput, f.attainment, f.refused_share) == (0.1, 0.25, 0.25)
    assert f.tpot_p99_ratio == pytest.approx(1.1)
    assert f.by_bucket == {"text": (1, 3), "audio": (0, 1)}
    assert not f.qualifies


def _fig(good: int, tpot: float | None, by_bucket: dict[str, tuple[int, int]] | None = None) -> Figures:
    return Figures(
        sent=100, good=good, refused=0, duration=10.0, tpot_p99_ratio=tpot, by_bucket=by_bucket or {}
    )


def test_the_baseline_is_the_best_fixed_limit_holding_the_margin() -> None:
    o = Outcome(draw(1), 5.0)
    o.runs = {
        "direct": _fig(0, 3.0),
        "fixed 16": _fig(40, 0.8, {"text": (40, 50)}),
        "fixed 32": _fig(60, 0.95),  # more goodput, but over 0.9 × the objective: not a baseline
        "adaptive": _fig(50, 0.85, {"text": (35, 50)}),
    }
    assert o.best_fixed() == "fixed 16"
    assert o.ratio("adaptive", o.best_fixed()) == 1.25
    assert o.ratio("adaptive", "direct") == math.inf  # direct served nothing in SLO
    assert o.ratio("direct", "direct") is None
    assert o.bucket_gap("adaptive", "text") == pytest.approx(-0.1)
    o.runs["fixed 16"] = _fig(40, 0.91)
    assert o.best_fixed() is None and o.ratio("adaptive", None) is None


def test_spread_takes_the_worst_decile_on_the_bad_side() -> None:
    values = [float(v) for v in range(1, 21)]
    s = spread([*values, None])
    assert s is not None and (s.n, s.median, s.decile, s.worst) == (20, 10.5, 2.0, 1.0)
    t = spread(values, higher_is_better=False)
    assert t is not None and (t.decile, t.worst) == (19.0, 20.0)
    assert spread([None]) is None


def test_targets_judge_the_distribution() -> None:
    outcomes = []
    for i, adaptive in enumerate((0.8, 1.2, 1.5)):
        o = Outcome(dataclasses.replace(draw(i), mix={"text": 1.0}), 5.0)
        o.runs = {
            "direct": _fig(10, 2.0, {"text": (10, 100)}),
            "fixed 16": _fig(10, 0.8, {"text": (10, 100)}),
            "adaptive": _fig(round(10 * adaptive), 1.0 + i * 0.1, {"text": (round(10 * adaptive), 100)}),
        }
        outcomes.append(o)
    got = {t.name: (t.held, t.detail) for t in targets(outcomes)}
    assert got["÷ best qualifying fixed ≥ 1.0 at the median"][0] is True  # median 1.2
    assert got["÷ best qualifying fixed ≥ 0.9 in the worst decile"][0] is False  # 0.8
    assert got["÷ direct ≥ 1.3 at the median"][0] is False
    assert got["TPOT P99 ≤ 1.1 × objective on ≥ 90 % of workloads"] == (False, "2 of 3")
    assert got["text: in-SLO share ≥ best qualifying fixed's − 10 points at the median"][0] is True


def test_probes_are_spaced_and_at_most_n() -> None:
    refused = [(i, float(i)) for i in range(30)]  # one a second
    picked = family.probes(refused, 3, 10.0, seed=1)
    assert len(picked) == 3 and picked == sorted(picked)
    assert all(b - a >= 10 for a, b in itertools.pairwise(picked))
    assert len(family.probes(refused[:5], 3, 10.0, seed=1)) == 1  # all within 4 s: one fits


def test_refusals_late_even_if_sent_at_once_are_honest_and_only_the_others_are_probed() -> None:
    def refused(slack_ms: str | None) -> RequestRecord:
        rec = _rec("text", status=429)
        if slack_ms is not None:
            rec.headers["x-omnigate-slack-ms"] = slack_ms
        return rec

    late, early, unsaid = refused("-12.5"), refused("40.0"), refused(None)
    assert [family.honest_by_construction(r) for r in (late, early, unsaid)] == [True, False, False]
    assert late.scaled(6.0).slack_ms == -75.0  # simulated ms, as the rest of the record
    fam = types.SimpleNamespace(admitted=[], refused=[late, early, unsaid], probed=[(1, early, _rec("text"))])
    text = "\n".join(family.calibration(cast(family.Family, fam)))
    assert (
        "Counterfactual: of 3 deadline refusals, 1 were honest by construction (late even sent at once at "
        "the engine's nominal prefill rate); of the other 2, 1 were replayed with admission forced and 1 met "
        "their deadline (100%). Refusals estimated to have met their deadline: 66.7% of all (2 ÷ 3 × 1 ÷ 1); "
        "MISS target < 5 %."
    ) in text
    fam.refused += [refused("-1.0")] * 37  # 40 refusals, 38 honest by construction: 2 ÷ 40 × 1 ÷ 1
    assert "met their deadline: 5.0% of all (2 ÷ 40 × 1 ÷ 1); MISS target < 5 %." in "\n".join(
        family.calibration(cast(family.Family, fam))
    )
    fam.refused.append(refused("-1.0"))
    assert "4.9% of all (2 ÷ 41 × 1 ÷ 1); PASS target < 5 %." in "\n".join(
        family.calibration(cast(family.Family, fam))
    )


def test_ablations_only_touch_existing_policy_keys() -> None:
    from gateway.livepolicy.policy import load_policy

    base = family.with_probe_class(load_policy(family.ROOT / "policies" / "default.yaml"))
    assert base.queue.classes["probe"].shed_by_deadline is False
    for over in family.ABLATIONS.values():
        policy, controller = family.variant(base, over)  # validates: an unknown key fails here
        assert policy.model_dump() != base.model_dump() or controller


def test_the_ablation_table_measures_from_the_mean_of_the_unchanged_runs() -> None:
    o = Outcome(draw(1), 5.0)
    again, third = family.AGAIN
    o.runs = {
        "fixed 16": _fig(40, 0.8),
        "adaptive": _fig(40, 0.8),  # 1.0
        again: _fig(44, 0.8),  # 1.1
        third: _fig(42, 0.8),  # 1.05: mean 1.05, spread (range) 0.1
        "− band reserve": _fig(32, 0.8),  # 0.8: Δ −0.25, beyond the spread
        "− spacing": _fig(42, 1.2),  # 1.05: Δ 0, its tail worse
    }
    rows = {line.split(" | ")[0]: line for line in family.ablation([o]) if line.startswith("| ")}
    assert rows["| band reserve"] == (
        "| band reserve | 0.800 | -0.250 | 0.800 | -0.250 | worse without it | 0.80 / 0.80 | 0.0% |"
    )
    assert rows["| spacing"] == (
        "| spacing | 1.050 | +0.000 | 1.050 | +0.000 | within the spread | 1.20 / 1.20 | 0.0% |"
    )
    assert (
        rows["| (unchanged: adaptive again)"]
        == "| (unchanged: adaptive again) | 1.100 | | 1.100 | | | 0.80 / 0.80 | 0.0% |"
    )
    assert "| adaptive LIFO" not in rows  # not run: no row
    assert rows["| lending"].endswith("not exercised: one pool per workload: nothing to lend | | |")


def test_content_keeps_the_family_tenants_and_priority_shares() -> None:
    d = draw(5)
    over = content(d)
    assert [t["name"] for t in over["tenants"]] == [f"sk-{t}" for t, _ in d.tenants]
    assert ("priorities" in over) == (d.high_share > 0)


@pytest.mark.e2e
async def test_a_tiny_run_reports_figures_taken_from_its_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 5 (a tuning seed): 0.53× capacity on a cap-128 engine, so even direct serves in SLO."""
    args = family.parse(
        ["--seeds", "5", "--duration", "10", "--drain", "10", "--sweep", "16", "--probes", "1"]
    )
    fam, lines = await family.main_async(args)
    [o] = fam.outcomes
    assert list(o.runs) == ["direct", "fixed 16", "adaptive"]
    assert o.ratio("direct", "direct") == 1.0
    adaptive = o.runs["adaptive"]
    assert adaptive == figures(fam.admitted, SLO, 10.0)  # the adaptive run's own records
    text = "\n".join(lines)
    assert "seeds: --seeds 5 (TUNING seeds: not a report)" in text
    for heading in ("| seed | cap | load |", "Distribution over the workloads", "Issue 39's targets"):
        assert heading in text
    assert f"| adaptive ÷ direct | {o.ratio('adaptive', 'direct'):.3f} |" in text
    assert "Early rejection — calibration" in text and "Counterfactual:" in text
    assert capsys.readouterr().out.count("family seeds: --seeds 5") == 1
