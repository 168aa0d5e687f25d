"""Audio found in answer events without parsing their base64, measured per stream; the relay counts it."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from gateway.relay.sse import SSERelay
from gateway.speech.events import read_json, speech_seconds
from gateway.speech.meter import SpeechMeter

pytestmark = pytest.mark.unit

RATE = 24_000


def wav(seconds: float, rate: int = RATE, extra_chunk: bytes = b"") -> bytes:
    data = b"\x01\x00" * int(seconds * rate)
    fmt = b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    body = b"WAVE" + fmt + extra_chunk + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def chat_chunk(audio: str | None = None, content: str | None = None, compact: bool = False) -> bytes:
    delta: dict[str, object] = {}
    if content is not None:
        delta["content"] = content
    if audio is not None:
        delta["audio"] = {"id": "audio-1", "data": audio}
    obj = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }
    if compact:
        obj["usage"] = None
        return json.dumps(obj, separators=(",", ":")).encode()
    return json.dumps(obj).encode()


def speech_chunk(audio: str, fmt: str = "wav") -> bytes:
    body = {
        "id": "speech-1",
        "object": "audio.speech.chunk",
        "index": 0,
        "audio": {"data": audio, "format": fmt, "mime_type": f"audio/{fmt}", "sample_rate": RATE},
        "finish_reason": None,
    }
    return json.dumps(body).encode()


def test_a_chat_audio_delta_is_read_from_its_header_and_the_rest_parsed() -> None:
    obj, seconds = read_json(chat_chunk(b64(wav(0.8))))
    assert seconds == pytest.approx(0.8)
    assert obj["choices"][0]["delta"]["audio"] == {"id": "audio-1", "data": ""}


def test_a_speech_chunk_in_wav_and_in_pcm() -> None:
    assert read_json(speech_chunk(b64(wav(1.25))))[1] == pytest.approx(1.25)
    pcm = b"\x00\x00" * RATE * 2
    assert read_json(speech_chunk(b64(pcm), fmt="pcm"))[1] == pytest.approx(2.0)


def test_a_wav_with_chunks_before_its_data_is_read_further() -> None:
    assert read_json(speech_chunk(b64(wav(0.5, extra_chunk=b"LIST" + struct.pack("<I", 200) + b"x" * 200))))[
        1
    ] == pytest.approx(0.5)


def test_events_without_audio_are_parsed_whole() -> None:
    obj, seconds = read_json(chat_chunk(content='the word "audio" and "data"'))
    assert seconds is None and obj["choices"][0]["delta"]["content"] == 'the word "audio" and "data"'
    final = json.dumps({"object": "audio.speech.chunk", "audio": None, "finish_reason": "stop"}).encode()
    assert read_json(final) == (json.loads(final), None)


def test_damaged_audio_counts_as_audio_of_no_length() -> None:
    assert read_json(speech_chunk("not base64!!"))[1] == 0.0
    assert read_json(speech_chunk(b64(b"RIFF....WAVEjunk" * 4)))[1] == 0.0


def test_a_whole_speech_answer() -> None:
    assert speech_seconds(wav(3.0), None) == pytest.approx(3.0)
    assert speech_seconds(b"\x00\x00" * RATE, "24000") == pytest.approx(1.0)
    assert speech_seconds(b"ID3...mp3", None) == 0.0


def test_the_meter_real_time_factor_and_stalls() -> None:
    m = SpeechMeter()
    for t in (10.0, 10.5, 11.0, 11.5):  # 0.8 s chunks every 0.5 s: ahead of playback
        m.add(t, 0.8)
    assert (m.first_at, m.seconds, m.stalls) == (10.0, pytest.approx(3.2), 0)
    assert m.rtf == pytest.approx(1.5 / 2.4)
    slow = SpeechMeter()
    for t in (0.0, 1.0, 2.0):  # 0.8 s chunks every second: the player runs dry before each
        slow.add(t, 0.8)
    assert slow.stalls == 2 and slow.rtf == pytest.approx(2.0 / 1.6)
    one = SpeechMeter()
    one.add(1.0, 2.0)
    assert one.rtf is None and one.stalls == 0


def test_the_relay_counts_the_first_audio_as_the_first_output_and_passes_bytes_unchanged() -> None:
    relay = SSERelay(strip_usage=False)
    events = [
        chat_chunk(b64(wav(0.8))),
        chat_chunk(content="hi", compact=True),
        chat_chunk(b64(wav(0.4)), compact=True),
    ]
    stream = b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    out = relay.feed(stream[:100], 1.0) + relay.feed(stream[100:], 2.0)
    assert out == stream
    assert relay.first_token_at == 2.0 and relay.done
    assert relay.audio.seconds == pytest.approx(1.2) and relay.audio.chunks == 2
    assert relay.content_chunks == 1  # audio is not a text token, even in compact JSON


def test_openais_speech_delta_holds_the_base64_itself() -> None:
    event = json.dumps({"type": "speech.audio.delta", "audio": b64(wav(0.6))}).encode()
    obj, seconds = read_json(event)
    assert obj == {"type": "speech.audio.delta", "audio": ""} and seconds == pytest.approx(0.6)
    done = json.dumps({"type": "speech.audio.done", "usage": {"input_tokens": 3}}).encode()
    assert read_json(done) == (json.loads(done), None)


def test_a_chat_delta_in_pcm_is_timed_by_the_rate_given_and_a_wav_by_its_own() -> None:
    pcm = b"\x00\x00" * 16_000 * 3  # 3 s at 16 kHz, 2 s at 24 kHz
    assert read_json(chat_chunk(b64(pcm)))[1] == 0.0  # no rate anywhere: audio of no known length
    assert read_json(chat_chunk(b64(pcm)), pcm_rate=16_000)[1] == pytest.approx(3.0)
    assert read_json(chat_chunk(b64(pcm)), pcm_rate=RATE)[1] == pytest.approx(2.0)
    assert read_json(chat_chunk(b64(wav(0.8, rate=16_000))), pcm_rate=RATE)[1] == pytest.approx(0.8)
    assert read_json(speech_chunk(b64(pcm), fmt="pcm"), pcm_rate=16_000)[1] == pytest.approx(2.0)
