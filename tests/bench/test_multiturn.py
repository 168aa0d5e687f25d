"""bench/scheduling.py's multiturn scenario, pure parts: the conversations it plans and the figures of a
run (no process is started)."""

from __future__ import annotations

from bench import scheduling
from bench.common.conversations import plan
from loadtest.records import RequestRecord


def test_conversations_are_seeded_and_shaped_as_the_scenario_says() -> None:
    convs = plan(42, rate=2.0, duration=60.0, think_s=3.0, max_tokens=64)
    assert plan(42, rate=2.0, duration=60.0, think_s=3.0, max_tokens=64) == convs
    assert 80 <= len(convs) <= 160  # Poisson at 2/s over 60 s
    assert all(0 <= c.start < 60 for c in convs) and convs == sorted(convs, key=lambda c: c.start)
    assert {len(c.questions) for c in convs} == set(range(3, 11))
    assert all(
        1 <= len(c.images) <= 2 and len(c.max_tokens) == len(c.think_s) == len(c.questions) for c in convs
    )
    assert len({c.system for c in convs}) == 3  # shared system prompts
    assert len({img for c in convs for img in c.images}) > len(convs)  # pictures of their own


def _turn(ttft: float, prompt: int, cached: int | None, status: int = 200) -> RequestRecord:
    rec = RequestRecord(scheduled=0.0, sent=0.0, status=status, output_tokens=11, prompt_tokens=prompt)
    rec.cached_tokens = cached
    if status == 200:
        rec.ttft, rec.e2e = ttft, ttft + 0.3
    else:
        rec.error = "slo_unattainable"
    return rec


def test_a_runs_figures_count_turns_in_slo_and_the_engines_own_prefill() -> None:
    records = [
        _turn(0.5, 1000, 800),
        _turn(3.0, 2000, 0),
        _turn(0.2, 500, 400),
        _turn(0.1, 0, None, status=429),
    ]
    run = scheduling.TurnsRun("first_token", 4.0, records, duration=10.0)
    assert run.attainment == 0.5 and run.goodput == 0.2
    row = run.row()
    # prefill per answered turn: (3500 − 1200) / 3; cached share 1200 / 3500
    assert row.startswith("| 4.00 | first_token | 4 | 50.0% | 0.20 |") and row.endswith(
        "| 25.0% | 767 | 34% |"
    )
