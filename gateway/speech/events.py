"""Audio in an answer's JSON: where its base64 lies, and how many seconds it holds (read from its header).

sglang-omni sends speech as a chat chunk's `choices[0].delta.audio = {id, data}` (a whole answer's
`message.audio`), as a speech chunk's top-level `audio = {data, format, mime_type, sample_rate}`, or (later
servers) as OpenAI's `speech.audio.delta` event whose `audio` is the base64 itself; each
`data` is one complete base64 WAV (raw 16-bit mono PCM for `response_format: pcm`). An event is tens of KB of
base64 inside a few hundred bytes of JSON. The payload is found by its key and its closing quote (base64 holds
no quote and no escape), only the WAV header at its front is decoded, its length is sized by arithmetic, and
only the JSON around the cut-out payload is parsed.
"""

from __future__ import annotations

import binascii
from typing import Any

import orjson

from gateway.estimate.audio import wav_seconds
from gateway.estimate.blob import MediaError

AUDIO_KEY = b'"audio"'
DATA_KEY = b'"data"'
EVENT_SCAN = 1024
"""An event's audio key comes within its first bytes (the envelope's short fields come first)."""
HEAD_CHARS = (64, 5464)
"""Base64 characters decoded for the header: 48 bytes hold a plain WAV header; 4 KB any header we read."""
PCM_BYTES_PER_SAMPLE = 2  # sglang-omni's PCM is 16-bit mono


def read_json(
    payload: bytes, scan: int = EVENT_SCAN, pcm_rate: int | None = None
) -> tuple[Any, float | None]:
    """The JSON document with its audio payload cut out (`data` left as ""), and the seconds that payload
    held; None when it holds no audio. Looks for the audio key within the first `scan` bytes; raw PCM
    without a rate of its own (`speech.audio.delta`, a chat delta asked as `pcm`) is sized by `pcm_rate`
    (the stream's x-sample-rate, else the model's).
    Raises orjson.JSONDecodeError like `orjson.loads`."""
    span = _audio_span(payload, scan)
    if span is None:
        return orjson.loads(payload), None
    start, end = span
    obj = orjson.loads(payload[:start] + payload[end:])
    audio = audio_object(obj)
    whole = isinstance(obj, dict) and obj.get("audio") == ""
    if not whole and (audio is None or audio.get("data") != ""):  # not an audio payload: read it whole
        return orjson.loads(payload), None
    rate = audio.get("sample_rate") if audio is not None else None
    return obj, b64_audio_seconds(payload, start, end, rate if isinstance(rate, int) else pcm_rate)


def audio_object(obj: Any) -> dict[str, Any] | None:
    """The audio object of a speech chunk, a chat chunk's delta or a whole chat answer's message."""
    if not isinstance(obj, dict):
        return None
    audio = obj.get("audio")
    if isinstance(audio, dict):
        return audio
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    for key in ("delta", "message"):
        holder = choices[0].get(key)
        if isinstance(holder, dict) and isinstance(holder.get("audio"), dict):
            audio = holder["audio"]
            return audio if isinstance(audio, dict) else None
    return None


def _audio_span(payload: bytes, scan: int) -> tuple[int, int] | None:
    """(start, end) of the base64 string after the first `"audio"` key: its value itself (OpenAI's
    `speech.audio.delta`), or the value of the `"data"` key in its object."""
    at = payload.find(AUDIO_KEY, 0, scan)
    if at < 0:
        return None
    value = payload.find(b'"', at + len(AUDIO_KEY), at + scan)
    if value < 0:
        return None
    between = payload[at + len(AUDIO_KEY) : value].strip()
    if between != b":":  # an object: its `data` key
        if not between.startswith(b":") or not between[1:].lstrip().startswith(b"{"):
            return None
        key = payload.find(DATA_KEY, at, at + scan)
        if key < 0:
            return None
        value = payload.find(b'"', key + len(DATA_KEY))
        if value < 0 or payload[key + len(DATA_KEY) : value].strip() != b":":
            return None
    end = payload.find(b'"', value + 1)
    return (value + 1, end) if end > value else None


def b64_audio_seconds(payload: bytes, start: int, end: int, sample_rate: int | None) -> float:
    """Seconds of the audio whose base64 is payload[start:end]: a WAV by its header, raw PCM by the event's
    sample rate; 0 for what cannot be read (it is still audio that reached the client)."""
    n = end - start
    if n <= 0 or n % 4:
        return 0.0
    pad = (payload[end - 1] == 0x3D) + (payload[end - 2] == 0x3D)  # "="
    total = n // 4 * 3 - pad
    try:
        head = binascii.a2b_base64(payload[start : start + min(n, HEAD_CHARS[0])], strict_mode=True)
        if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
            try:
                return wav_seconds(head, total)
            except MediaError:  # extra chunks before `data`: read up to 4 KB of header
                more = payload[start : start + min(n, HEAD_CHARS[1])]
                return wav_seconds(binascii.a2b_base64(more, strict_mode=True), total)
    except (binascii.Error, MediaError, ValueError):
        return 0.0
    if sample_rate and sample_rate > 0:
        return total / (PCM_BYTES_PER_SAMPLE * sample_rate)
    return 0.0


SPEECH_HEADERS = ("content-disposition", "x-prompt-tokens", "x-completion-tokens", "x-engine-time")
SPEECH_FORMAT_HEADERS = ("x-sample-rate", "x-channels", "x-bit-depth")
"""What a whole /v1/audio/speech answer says besides its bytes (the snapshot's, and later servers' format)."""


def speech_seconds(body: bytes, sample_rate: str | None) -> float:
    """Seconds of a whole speech answer's raw audio: a WAV by its header, PCM by the server's sample-rate
    header; 0 for a compressed format (its length is not read)."""
    if body[:4] == b"RIFF" and body[8:12] == b"WAVE":
        try:
            return wav_seconds(body[:4096], len(body))
        except MediaError:
            return 0.0
    if sample_rate is not None and sample_rate.isdigit() and int(sample_rate) > 0:
        return len(body) / (PCM_BYTES_PER_SAMPLE * int(sample_rate))
    return 0.0
