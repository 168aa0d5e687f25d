"""A `version: later` pool in front of the simulator's 0.1.9 surface with its metrics on: PCM speech relayed
and measured, and `/admin/state` showing the server's own audio view beside the gateway's for the same
answers."""

from __future__ import annotations

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
