"""Speech priced before it runs: audio seconds from the expected text, learned per (tenant, voice)."""

from __future__ import annotations

import pytest

from gateway.estimate.estimator import Estimator
from gateway.estimate.settings import BucketPolicy, EstimationPolicy, ModelProfile
from gateway.estimate.speech import voice_of

pytestmark = pytest.mark.unit

QWEN = ModelProfile(match="qwen*", context_length=8192, default_max_tokens=2048)
SPEECH = {"model": "qwen3-omni", "input": "word " * 40, "voice": "Chelsie"}


def make() -> Estimator:
    policy = EstimationPolicy(models=[QWEN], default_output_tokens=100, speech_seconds_per_token=0.3)
    return Estimator(policy, BucketPolicy())


def audio_chat(voice: str | None = None) -> dict[str, object]:
    audio = {"voice": voice} if voice else {}
    return {
        "model": "qwen3-omni",
        "messages": [{"role": "user", "content": "hi"}],
        "modalities": ["text", "audio"],
        "audio": audio,
    }


def test_which_requests_speak_and_in_which_voice() -> None:
    assert voice_of(SPEECH, "speech") == "Chelsie"
    assert voice_of({"input": "x"}, "speech") == "default"
    assert voice_of(audio_chat("Ethan"), "chat") == "Ethan"
    assert voice_of(audio_chat(), "chat") == "default"
    assert voice_of({"modalities": ["text"]}, "chat") is None


def test_a_speech_request_is_its_input_read_back_in_the_speech_bucket() -> None:
    cost, bucket = make().estimate(SPEECH, endpoint="speech", tenant="t")
    assert bucket == "speech"
    assert cost.expected_output_tokens == cost.text_tokens > 0
    assert cost.speech_seconds == pytest.approx(cost.text_tokens * 0.3)
    capped, _ = make().estimate({**SPEECH, "max_new_tokens": 5}, endpoint="speech", tenant="t")
    assert capped.expected_output_tokens == 5 and capped.speech_seconds == pytest.approx(1.5)


def test_a_chat_that_speaks_is_priced_its_expected_answer_as_audio() -> None:
    cost, bucket = make().estimate(audio_chat(), endpoint="chat", tenant="t")
    assert bucket == "speech" and cost.expected_output_tokens == 100
    assert cost.speech_seconds == pytest.approx(30.0)
    text, text_bucket = make().estimate({**audio_chat(), "modalities": ["text"]}, endpoint="chat", tenant="t")
    assert text_bucket == "text" and text.speech_seconds == 0.0


def test_the_rate_is_learned_per_tenant_and_voice_and_survives_a_reload() -> None:
    est = make()
    for _ in range(5):  # output_min_samples
        est.observe_speech("t", "Ethan", 100, 50.0)  # a slow voice: 0.5 s per token
    assert est.estimate(audio_chat("Ethan"), endpoint="chat", tenant="t")[0].speech_seconds == pytest.approx(
        50.0
    )
    assert est.estimate(audio_chat("Chelsie"), endpoint="chat", tenant="t")[
        0
    ].speech_seconds == pytest.approx(30.0)
    assert est.estimate(audio_chat("Ethan"), endpoint="chat", tenant="u")[0].speech_seconds == pytest.approx(
        30.0
    )
    reloaded = est.reconfigure(EstimationPolicy(models=[QWEN], default_output_tokens=100), BucketPolicy())
    assert reloaded.estimate(audio_chat("Ethan"), endpoint="chat", tenant="t")[
        0
    ].speech_seconds == pytest.approx(50.0)
    est.observe_speech("t", "Mute", 0, 3.0)  # nothing to learn a rate from
    est.observe_speech("t", "Mute", 10, 0.0)
    assert ("t", "Mute") not in est.speech.learned.snapshot()
