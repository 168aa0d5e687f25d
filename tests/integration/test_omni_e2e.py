"""The whole house in front of sglang-omni: `omnigate serve`, two `omnigate sim --api sglang-omni` processes
of the snapshot, tenants with keys, the real `openai` client.

One run through what a client of an omni pool meets: its content parts reach the snapshot as the lists it
reads (and cost what the server counts for them), a request the server fails is the client's 422 and opens
no circuit, clients that hang up keep their backends' slots charged until the servers are done with their
requests, and `/admin/state` tells the kind, the stages and the signals the servers do not give.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.estimate.helpers import b64, data_uri, image_bytes, wav_bytes
from tests.integration.conftest import Admin, write_config
from tests.support.processes import Processes
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

MODEL = "qwen3-omni"
PNG = data_uri(image_bytes("PNG", 320, 240))
WAV = b64(wav_bytes(1.5))
ASK = "Describe the picture and the sound."
KEY = "og-acme-e2e-key-0001"


def _config(workdir: Path, backends: list[str]) -> Path:
    pool = {"kind": "sglang-omni", "models": [MODEL], "backends": backends, "health_interval_s": 0.2}
    return write_config(
        workdir / "gateway.yaml", backends[0], {"kind": "memory"}, [{"id": "acme", "keys": [KEY]}], pool
    )


def _backends(admin: Admin) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = admin.call("GET", "/admin/state")["pools"]["interactive"]["backends"]
    return entries


def test_an_omni_pool_end_to_end(tmp_path: Path) -> None:
    procs = Processes(tmp_path)
    try:
        sims = [procs.sim("--api", "sglang-omni", "--time-scale", "10", "--model", MODEL) for _ in range(2)]
        gw = procs.gateway(_config(tmp_path, [s.url for s in sims]))
        admin = Admin(gw.url)
        assert wait_for(lambda: all(b["running"] == 0 for b in _backends(admin)))
        state = admin.call("GET", "/admin/state")["pools"]["interactive"]
        assert state["kind"] == "sglang-omni"
        for entry in state["backends"]:
            assert [s["stage"] for s in entry["stages"]] == ["encoder", "thinker", "talker", "code2wav"]
            assert sorted(entry["missing_signals"]) == ["kv_capacity", "kv_usage", "queued"]

        # content parts from the SDK cost what the snapshot counts for its own lists
        lists = {"images": [PNG], "audios": ["data:audio/wav;base64," + WAV]}
        direct = httpx.post(
            sims[0].url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": ASK}], "max_tokens": 4, **lists},
            timeout=30,
        ).json()["usage"]["prompt_tokens"]
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        parts: Any = [
            {"type": "image_url", "image_url": {"url": PNG}},
            {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}},
            {"type": "text", "text": ASK},
        ]
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": parts}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == direct

        # a request the server fails (over its 8192-token context): the client's, no circuit opens
        for _ in range(3):
            with pytest.raises(openai.UnprocessableEntityError) as failed:
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "word " * 8000}], max_tokens=4
                )
            assert failed.value.code == "backend_request_failed"
        assert [b["circuit"] for b in _backends(admin)] == ["closed", "closed"]

        # three clients hang up on their streams: their slots stay charged while the servers run them on
        for _ in range(3):
            with httpx.stream(
                "POST",
                gw.url + "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": ASK}],
                    "max_tokens": 30,
                    "stream": True,
                },
                headers={"authorization": f"Bearer {KEY}"},
                timeout=30,
            ) as resp:
                assert resp.status_code == 200
                next(resp.iter_raw())
        held = wait_for(lambda: sum(b["held"] for b in _backends(admin)) == 3)
        assert held and sum(b["active"] for b in _backends(admin)) == 3
        assert wait_for(
            lambda: all(b["active"] == 0 and b["held"] == 0 for b in _backends(admin)), timeout=30
        )
        assert sum(httpx.get(s.url + "/health").json()["total_requests"] for s in sims) == 0
        admin.close()
    finally:
        procs.close()
