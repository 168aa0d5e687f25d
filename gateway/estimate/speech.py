"""Speech out, priced before it runs: the audio seconds an answer will speak, learned per (tenant, voice).

A chat with `modalities` holding "audio", or a /v1/audio/speech request, makes the server's talker speak its
text answer. The audio it will make is expected text tokens × audio seconds per text token, a rate learned
online per tenant and voice from the answers' real durations (read from the WAV headers in the stream) over
the text tokens the server reported; until `output_min_samples` answers were measured the policy's
`speech_seconds_per_token` stands in. Those seconds are what the talker and code2wav stages work for and
what an `audio_spm` quota counts.
"""

from __future__ import annotations

from typing import Any

from gateway.estimate.output import KeyedEwma

DEFAULT_VOICE = "default"  # sglang-omni's default voice


def voice_of(body: dict[str, Any], endpoint: str) -> str | None:
    """The voice a validated request's answer speaks in; None when it asks for text only."""
    if endpoint == "speech":
        return str(body.get("voice") or DEFAULT_VOICE)
    if endpoint == "chat" and "audio" in (body.get("modalities") or ()):
        audio = body.get("audio") or {}
        return str(audio.get("voice") or DEFAULT_VOICE)
    return None


class SpeechRate:
    """Audio seconds per output text token, per (tenant, voice)."""

    def __init__(self, default: float, learned: KeyedEwma) -> None:
        self.default = default
        self.learned = learned

    def seconds(self, tenant: str, voice: str, text_tokens: int) -> float:
        rate = self.learned.mean(tenant, voice)
        return text_tokens * (self.default if rate is None else rate)

    def observe(self, tenant: str, voice: str, text_tokens: int, audio_seconds: float) -> None:
        """One whole answer: the text tokens the server reported and the audio seconds it delivered."""
        if text_tokens > 0 and audio_seconds > 0:
            self.learned.observe(tenant, voice, audio_seconds / text_tokens)
