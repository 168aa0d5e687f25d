"""Audio seconds as a quota, end to end: a real gateway (SQLite or Redis store) in front of a simulated
sglang-omni server process. An `audio_spm` tenant is reserved the audio its answers are predicted to speak
and charged, in its day/month ledger, the audio they delivered (the server's own accounting is the
reference); past its limit (or its daily audio budget) a speaking request gets 429 with the
`x-ratelimit-*-audio-seconds` headers, while its text requests still pass."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.http.app import create_app
from tests.gateway.conftest import ADMIN, gateway_config
from tests.support.processes import ManagedProcess, Processes
from tests.support.servers import serve
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

MODEL = "test-model"
KEY = "og-speaker-quota-test-0123456789"
AUTH = {"authorization": f"Bearer {KEY}"}
TEXT = "The quick brown fox jumps over the lazy dog, then rests in the warm afternoon sun."
SPEECH = {"model": MODEL, "voice": "default", "input": TEXT}
SPOKEN_CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about foxes."}],
    "modalities": ["text", "audio"],
    "max_tokens": 30,
}
TEXT_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


@pytest.fixture(scope="module")
def omni_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    group = Processes(tmp_path_factory.mktemp("omni"))
    try:
        yield group.sim("--api", "sglang-omni", "--time-scale", "50", "--model", MODEL, "--seed", "3")
    finally:
        group.close()


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == "sqlite":
        return {"kind": "sqlite", "path": str(tmp_path / "tenants.sqlite3")}
    return {
        "kind": "redis",
        "redis_url": request.getfixturevalue("redis_url"),
        "redis_prefix": request.getfixturevalue("redis_prefix"),
        "outbox_path": str(tmp_path / "outbox.sqlite3"),
    }


def _gateway(
    stack: ExitStack, tmp_path: Path, sim: ManagedProcess, store: dict[str, Any], **quotas: int
) -> str:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\n")
    pool = {
        "name": "interactive",
        "kind": "sglang-omni",
        "models": [MODEL],
        "backends": [sim.url],
        "health_interval_s": 0.2,
    }
    config = gateway_config(
        [sim.url],
        policy,
        pools=[pool],
        store=store,
        auth={"required": True},
        tenants=[{"id": "speaker", "keys": [KEY], "quotas": quotas}],
    )
    return stack.enter_context(serve(create_app(config))).url


def _made(sim: ManagedProcess) -> float:
    """The audio seconds of the last request the server finished, by its own accounting."""
    record = httpx.get(sim.url + "/sim/omni/accounting?limit=1").json()["requests"][-1]
    return float(record["audio_seconds"])


def _usage(gw: str) -> dict[str, Any]:
    resp = httpx.get(
        gw + "/admin/tenants/speaker/usage", params={"days": 1}, headers={"authorization": f"Bearer {ADMIN}"}
    )
    assert resp.status_code == 200, resp.text
    report: dict[str, Any] = resp.json()
    return report


def test_the_ledger_charges_the_audio_the_answers_delivered(
    omni_sim: ManagedProcess, store: dict[str, Any], tmp_path: Path
) -> None:
    with ExitStack() as stack:
        gw = _gateway(stack, tmp_path, omni_sim, store, audio_spm=600)
        delivered_ms = 0
        with httpx.Client(base_url=gw, headers=AUTH, timeout=30) as client:
            for path, body in (
                ("/v1/audio/speech", {**SPEECH, "stream": True}),
                ("/v1/audio/speech", SPEECH),
                ("/v1/chat/completions", {**SPOKEN_CHAT, "stream": True}),
                ("/v1/chat/completions", SPOKEN_CHAT),
            ):
                answer = client.post(path, json=body)
                assert answer.status_code == 200, answer.text
                assert answer.headers["x-ratelimit-limit-audio-seconds"] == "600"
                delivered_ms += round(_made(omni_sim) * 1000)
            assert client.post("/v1/chat/completions", json=TEXT_CHAT).status_code == 200
        assert wait_for(lambda: _usage(gw)["concurrent"]["active"] == 0)
        report = _usage(gw)
    assert delivered_ms > 0
    assert (report["today"]["requests"], report["today"]["audio_seconds"]) == (5, delivered_ms / 1000)
    assert report["month"]["audio_seconds"] == delivered_ms / 1000


def test_past_its_audio_limit_a_tenant_may_still_ask_for_text(
    omni_sim: ManagedProcess, store: dict[str, Any], tmp_path: Path
) -> None:
    with ExitStack() as stack:
        gw = _gateway(stack, tmp_path, omni_sim, store, audio_spm=2)
        with httpx.Client(base_url=gw, headers=AUTH, timeout=30) as client:
            first = client.post("/v1/audio/speech", json=SPEECH)  # more than 2 s, admitted on a full bucket
            assert first.status_code == 200
            refused = client.post("/v1/audio/speech", json=SPEECH)
            text = client.post("/v1/chat/completions", json=TEXT_CHAT)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "audio_seconds_per_minute_exceeded"
    assert float(refused.headers["retry-after"]) > 0
    assert refused.headers["x-ratelimit-limit-audio-seconds"] == "2"
    assert refused.headers["x-ratelimit-remaining-audio-seconds"] == "0"
    assert text.status_code == 200


def test_past_its_daily_audio_budget_a_tenant_may_still_ask_for_text(
    omni_sim: ManagedProcess, store: dict[str, Any], tmp_path: Path
) -> None:
    with ExitStack() as stack:
        gw = _gateway(stack, tmp_path, omni_sim, store, daily_audio_seconds=3)
        with httpx.Client(base_url=gw, headers=AUTH, timeout=30) as client:
            first = client.post("/v1/audio/speech", json=SPEECH)  # more than 3 s, on an untouched budget
            assert first.status_code == 200
            spoken_ms = round(_made(omni_sim) * 1000)
            assert wait_for(lambda: _usage(gw)["concurrent"]["active"] == 0)
            refused = client.post("/v1/audio/speech", json=SPEECH)
            text = client.post("/v1/chat/completions", json=TEXT_CHAT)
        today = _usage(gw)["today"]
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "daily_audio_budget_exceeded"
    assert text.status_code == 200
    assert (today["audio_seconds_limit"], today["audio_seconds_remaining"]) == (3, 0.0)
    assert spoken_ms > 3000 and today["audio_seconds"] == spoken_ms / 1000  # the text spoke nothing
