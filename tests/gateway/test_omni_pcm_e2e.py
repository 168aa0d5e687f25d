"""A `version: later` pool in front of the simulator's 0.1.9 surface with its metrics on: PCM speech relayed
and measured, and `/admin/state` showing the server's own audio view beside the gateway's for the same
answers."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import httpx
import pytest

from tests.gateway.test_omni_backends import MODEL, backends, omni_gateway, sims  # noqa: F401
from tests.support.servers import ServerThread
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

TEXT = "The quick brown fox jumps over the lazy dog, then rests in the warm afternoon sun."


def test_admin_state_shows_the_servers_audio_metrics_beside_the_gateways(
    sims,  # noqa: F811
    start_gateway: Callable[..., ServerThread],
) -> None:
    sim = sims("--omni-release", "later", "--enable-metrics")
    gw = omni_gateway(start_gateway, [sim.url], version="later")
    assert wait_for(lambda: backends(gw)[0]["running"] is not None)
    total = 0
    for _ in range(3):
        with httpx.stream(
            "POST",
            gw + "/v1/audio/speech",
            json={
                "model": MODEL,
                "input": TEXT,
                "voice": "default",
                "stream": True,
                "response_format": "pcm",
            },
            timeout=30,
        ) as reply:
            assert reply.status_code == 200 and reply.headers["content-type"] == "audio/pcm"
            assert reply.headers["x-sample-rate"] == "24000"
            total += sum(len(piece) for piece in reply.iter_raw())
    assert wait_for(lambda: (backends(gw)[0]["audio"]["server"] or {}).get("answers") == 3)
    audio = backends(gw)[0]["audio"]
    gateway, server = audio["gateway"], audio["server"]
    assert gateway["answers"] == 3 and gateway["audio_seconds"] == pytest.approx(total / 48_000, abs=1e-3)
    assert server["audio_seconds"] == pytest.approx(gateway["audio_seconds"], abs=1e-3)  # the same audio
    assert gateway["ttfa_s_mean"] > 0 and gateway["rtf_mean"] > 0
    assert server["ttfp_s_mean"] > 0 and server["rtf_mean"] > 0


def test_chat_audio_asked_as_pcm_is_timed_at_the_models_rate(
    sims,  # noqa: F811
    start_gateway: Callable[..., ServerThread],
) -> None:
    """0.1.9's chat deltas in `pcm` carry no rate: the model's `speech_sample_rate` (24 kHz) times them."""
    sim = sims("--omni-release", "later")
    gw = omni_gateway(start_gateway, [sim.url], version="later")
    pcm_bytes = 0
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": TEXT}],
        "modalities": ["text", "audio"],
        "audio": {"format": "pcm"},
        "stream": True,
    }
    with httpx.stream("POST", gw + "/v1/chat/completions", json=body, timeout=30) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices") or ():
                    data = ((choice.get("delta") or {}).get("audio") or {}).get("data")
                    if data:
                        raw = base64.b64decode(data)
                        assert raw[:4] != b"RIFF"  # raw PCM, not a WAV
                        pcm_bytes += len(raw)
    assert pcm_bytes > 0
    assert wait_for(lambda: backends(gw)[0]["audio"]["gateway"]["answers"] == 1)
    seconds = backends(gw)[0]["audio"]["gateway"]["audio_seconds"]
    assert seconds == pytest.approx(pcm_bytes / 48_000, abs=1e-3)
