"""Agreement with the simulated backend's independent prompt count on the load test's own mixed workload.

The simulator (loadtest/sim/tokens.py) decodes image headers with Pillow and uses its own copy of the
published formulas, and counts text as UTF-8 bytes / 4; we read headers by hand and fit text to Qwen's BPE.
Images and audio must agree within ±3 % (measured: exactly equal); text within ±15 % per request
(measured: ours 7–10 % lower — on this word-list text the real Qwen tokenizer is ~10 % below ours and
~22 % below the simulator's bytes/4).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.estimate.estimator import Estimator
from gateway.estimate.settings import BucketPolicy, EstimationPolicy
from loadtest.media import MediaCache
from loadtest.sim.profile import load_profile
from loadtest.sim.tokens import PromptCounter
from loadtest.workload import Dist, ImageSpec, RequestFactory, Workload


def test_prompt_estimates_agree_with_simulator(tmp_path: Path) -> None:
    workload = Workload(
        mix={"text": 5, "single_image": 3, "multi_image": 2, "audio": 1, "long_doc": 1},
        images={
            "single_image": ImageSpec(
                resolutions=[(1024, 768), (333, 517), (1920, 1080), (50, 50)], variants=1
            ),
            "multi_image": ImageSpec(
                resolutions=[(800, 600), (1001, 99), (4000, 3000)], count=(2, 4), format="jpeg", variants=1
            ),
        },
        long_doc_tokens=Dist(dist="uniform", min=6000, max=9000),
    )
    factory = RequestFactory(workload, MediaCache(root=tmp_path))
    sim = PromptCounter(load_profile("default"))
    est = Estimator(EstimationPolicy(), BucketPolicy())
    buckets: set[str] = set()
    text_ratios: list[float] = []
    for _ in range(60):
        req = factory.next()
        cost, bucket = est.estimate(req.body, endpoint="chat", tenant="t")
        count = sim.chat(req.body["messages"])
        long = cost.prompt_tokens > BucketPolicy().long_doc_prompt_tokens
        assert bucket == ({"long_doc": "long_doc" if long else "text"}.get(req.bucket, req.bucket))
        buckets.add(bucket)
        sim_vision = count.image_tokens + count.images * load_profile("default").vision.markers_per_image
        sim_audio = count.total - count.text - sim_vision
        assert cost.vision_tokens == pytest.approx(sim_vision, rel=0.03, abs=0)
        assert cost.audio_tokens == pytest.approx(sim_audio, rel=0.03, abs=0)
        text_ratios.append(cost.text_tokens / count.text)
    assert buckets == {"text", "single_image", "multi_image", "audio", "long_doc"}
    assert all(0.85 <= r <= 1.15 for r in text_ratios), (min(text_ratios), max(text_ratios))
