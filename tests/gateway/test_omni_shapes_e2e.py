"""Both request shapes through the gateway to simulated servers of each version: the real `openai` client's
content parts reach a snapshot server as its top-level lists, a later server as they are, and an omni-shaped
request reaches a plain SGLang server as content parts — each server counting the same prompt as if it had
been sent its own shape directly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.estimate.helpers import b64, data_uri, image_bytes, wav_bytes
from tests.gateway.test_omni_backends import MODEL, backends, omni_gateway
from tests.support.processes import ManagedProcess, Processes
from tests.support.servers import ServerThread
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

PNG = data_uri(image_bytes("PNG", 640, 480))
WAV = b64(wav_bytes(2.5))
TEXT = "What do you see and hear?"
PARTS = [
    {"type": "text", "text": TEXT},
    {"type": "image_url", "image_url": {"url": PNG}},
    {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}},
]
LISTS = {"images": [PNG], "audios": ["data:audio/wav;base64," + WAV]}


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ManagedProcess]]:
    group = Processes(tmp_path_factory.mktemp("shapes"))

    def start(*args: str) -> ManagedProcess:
        return group.sim("--time-scale", "50", "--model", MODEL, "--seed", "7", *args)

    try:
        yield start
    finally:
        group.close()


def _direct(url: str, body: dict[str, Any]) -> dict[str, Any]:
    usage: dict[str, Any] = httpx.post(url + "/v1/chat/completions", json=body, timeout=30).json()["usage"]
    return usage


def _lists_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": TEXT}],
        "max_tokens": 4,
        **LISTS,
        **extra,
    }


@pytest.mark.parametrize("version", ["snapshot", "later"])
def test_the_openai_clients_content_parts_count_as_the_servers_own_shape(
    sims, start_gateway: Callable[..., ServerThread], version: str
) -> None:
    sim = sims("--api", "sglang-omni", "--omni-release", version)
    gw = omni_gateway(start_gateway, [sim.url], version=version)
    assert wait_for(lambda: backends(gw)[0]["running"] is not None)
    own_shape = _direct(sim.url, _lists_body())
    assert own_shape["prompt_tokens"] > 300  # the image and the clip counted as media, not as text

    client = openai.OpenAI(base_url=gw + "/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": PARTS}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert whole.usage is not None and whole.usage.prompt_tokens == own_shape["prompt_tokens"]
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == own_shape["prompt_tokens"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("version", ["snapshot", "later"])
def test_the_top_level_lists_are_priced_and_bucketed_like_the_parts(
    sims, start_gateway: Callable[..., ServerThread], version: str
) -> None:
    sim = sims("--api", "sglang-omni", "--omni-release", version)
    gw = omni_gateway(start_gateway, [sim.url], version=version)
    assert wait_for(lambda: backends(gw)[0]["running"] is not None)
    as_lists = httpx.post(gw + "/v1/chat/completions", json=_lists_body(), timeout=30)
    parts_body = {"model": MODEL, "messages": [{"role": "user", "content": PARTS}], "max_tokens": 4}
    as_parts = httpx.post(gw + "/v1/chat/completions", json=parts_body, timeout=30)
    assert as_lists.status_code == as_parts.status_code == 200
    for header in ("x-omnigate-bucket", "x-omnigate-estimated-tokens"):
        assert as_lists.headers[header] == as_parts.headers[header]
    assert as_lists.headers["x-omnigate-bucket"] == "audio"
    assert as_lists.json()["usage"]["prompt_tokens"] == as_parts.json()["usage"]["prompt_tokens"]


def test_a_plain_sglang_server_gets_the_lists_as_content_parts(sims, start_gateway) -> None:
    sim = sims("--api", "sglang")
    gw = start_gateway([sim.url]).url
    parts_body = {"model": MODEL, "messages": [{"role": "user", "content": PARTS}], "max_tokens": 4}
    own_shape = _direct(sim.url, parts_body)
    assert own_shape["prompt_tokens"] > 300
    client = openai.OpenAI(base_url=gw + "/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": TEXT}]
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, extra_body=LISTS)
    assert resp.usage is not None and resp.usage.prompt_tokens == own_shape["prompt_tokens"]
