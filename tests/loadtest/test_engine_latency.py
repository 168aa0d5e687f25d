"""Engine-side TTFT and queue time from the scraped SGLang histograms, over the measured window only."""

from __future__ import annotations

import pytest

from loadtest.scrape import Sample, parse_prometheus, summarize_samples


def scrape(ttft: tuple[float, float, float], queue: tuple[float, float]) -> dict[str, float]:
    le_ttft = ("0.1", "0.2", "+Inf")
    le_queue = ("0.01", "+Inf")
    lines = [
        f'sglang:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {n}'
        for le, n in zip(le_ttft, ttft, strict=True)
    ]
    lines += [
        f'sglang:queue_time_seconds_bucket{{le="{le}",model_name="m"}} {n}'
        for le, n in zip(le_queue, queue, strict=True)
    ]
    lines.append('sglang:time_to_first_token_seconds_sum{model_name="m"} 99.0')
    return parse_prometheus("\n".join(lines))


def test_engine_ttft_and_queue_quantiles_come_from_the_histogram_delta() -> None:
    first = scrape((50, 60, 60), (60, 60))  # warm-up observations, before the window
    last = scrape(
        (50, 160, 160), (150, 160)
    )  # the window adds 100 TTFTs in 0.1–0.2 s, 10 queue waits > 10 ms
    assert first["ttft_le:0.2"] == 60 and "ttft_le:+Inf" in first and len(first) == 5
    s = summarize_samples([Sample(0.0, "a", True, first), Sample(1.0, "a", True, last)])
    # rank 99 of 100 in (0.1, 0.2]: 0.1 + 0.1 × 99/100 s; P50: 0.1 + 0.1 × 50/100 s
    assert s["engine_ttft_ms"] == pytest.approx({"p50": 150.0, "p99": 199.0})
    # queue: 90 of 100 within 10 ms, the P99 rank falls in (0.01, +Inf] → the last finite bound
    assert s["engine_queue_ms"] == pytest.approx({"p50": 0.01 * 50 / 90 * 1000, "p99": 10.0})
