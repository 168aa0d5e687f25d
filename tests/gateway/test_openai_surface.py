"""What OpenAI clients expect, with the real `openai` client against a gateway in front of the simulator:
`x-ratelimit-*` headers on completions, embeddings and 429s (the quota's and the queue's); named priorities
in `x-priority`; model aliases in `/v1/models` and `/v1/models/{id}`; `/v1/embeddings` through auth, quota
and the queue."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.http.app import create_app
from gateway.settings.config import parse_config
from gateway.tenants.ratelimit_headers import go_duration
from loadtest.sim.config import SimConfig
from loadtest.sim.profile import load_profile
from loadtest.sim.server import create_app as create_sim
from loadtest.sim.tokens import PromptCounter
from tests.support.servers import ServerThread, serve

pytestmark = pytest.mark.e2e

MODEL = "surface-model"
ALIAS = "gpt-4o-mini"
KEY, EXACT_KEY, TIGHT_KEY = "sk-surface", "sk-surface-exact", "sk-surface-tight"
NO_WAIT_KEY = "sk-surface-no-wait"
RPM, TPM = 60, 120_000
MESSAGES = [{"role": "user", "content": "Tell me about the harbour."}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    tmp = tmp_path_factory.mktemp("surface")
    policy: dict[str, Any] = {"version": 1, "model_aliases": {ALIAS: MODEL}}
    (tmp / "policy.yaml").write_text(yaml.safe_dump(policy))
    tenants = [
        {"id": "surface", "keys": [KEY], "max_priority": 10, "quotas": {"rpm": RPM, "total_tpm": TPM}},
        {"id": "surface-exact", "keys": [EXACT_KEY], "quotas": {"rpm": RPM, "total_tpm": TPM}},
        {"id": "surface-tight", "keys": [TIGHT_KEY], "quotas": {"rpm": 2}},
    ]
    with ExitStack() as stack:
        sim = stack.enter_context(serve(create_sim(SimConfig(model=MODEL, time_scale=100.0, seed=9))))
        config = parse_config(
            {
                "policy_path": str(Path(tmp / "policy.yaml")),
                "watch_policy": False,
                "admin": {"token": "surface-admin"},
                "store": {"kind": "memory"},
                "access_log": False,
                "pools": [
                    {
                        "name": "interactive",
                        "models": [MODEL],
                        "backends": [sim.url],
                        "health_interval_s": 0.1,
                    }
                ],
                "tenants": tenants,
            },
            environ={},
        )
        yield stack.enter_context(serve(create_app(config)))


def _client(gateway: ServerThread, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


def _limits(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.startswith("x-ratelimit-")}


def _seconds(go: str) -> float:
    """Parse the Go durations the headers use (`12ms`, `1.5s`, `6m0s`, `1h0m0s`)."""
    if go.endswith("ms"):
        return int(go[:-2]) / 1000
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?([\d.]+)s", go)
    assert match is not None, go
    hours, minutes, secs = match.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(secs)


def test_completions_carry_openai_rate_limit_headers_exactly(gateway: ServerThread) -> None:
    client = _client(gateway, EXACT_KEY)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=5)
    estimated = int(raw.headers["x-omnigate-estimated-tokens"])
    # the levels at the moment of the reservation: this request is taken, nothing refilled yet
    assert _limits(raw.headers) == {
        "x-ratelimit-limit-requests": str(RPM),
        "x-ratelimit-remaining-requests": str(RPM - 1),
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": str(TPM),
        "x-ratelimit-remaining-tokens": str(TPM - estimated),
        "x-ratelimit-reset-tokens": go_duration(estimated * 60 / TPM),
    }
    assert raw.parse().choices[0].finish_reason == "length"
    stream = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, stream=True
    )
    headers = _limits(stream.headers)
    assert int(headers["x-ratelimit-remaining-requests"]) in (RPM - 2, RPM - 1)  # a refill since, at most
    assert len(list(stream.parse())) > 0


def test_a_429_carries_the_headers_too(gateway: ServerThread) -> None:
    client = _client(gateway, TIGHT_KEY)
    first = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert _limits(first.headers) == {  # 2 per minute, one taken: full again 30 s later; no token limit
        "x-ratelimit-limit-requests": "2",
        "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-reset-requests": "30s",
    }
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)  # the 2nd of 2
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    headers = info.value.response.headers
    assert info.value.code == "requests_per_minute_exceeded"
    assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"]) == ("2", "0")
    assert 55.0 < _seconds(headers["x-ratelimit-reset-requests"]) <= 60.0  # refilled only since the 2nd
    assert int(headers["retry-after"]) >= 1


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """A gateway whose one backend takes one request at a time, in front of a slow engine."""
    tmp = tmp_path_factory.mktemp("one-slot")
    policy = "version: 1\ncontroller: {algorithm: fixed, initial: 1, min: 1, max: 1}\n"
    (tmp / "policy.yaml").write_text(policy)
    tenants = [
        {"id": "surface", "keys": [KEY], "quotas": {"rpm": RPM, "total_tpm": TPM}},
        {"id": "surface-no-wait", "keys": [NO_WAIT_KEY], "quotas": {"rpm": RPM, "max_queued": 0}},
    ]
    with ExitStack() as stack:
        sim = stack.enter_context(serve(create_sim(SimConfig(model=MODEL, time_scale=1.0, seed=9))))
        config = parse_config(
            {
                "policy_path": str(tmp / "policy.yaml"),
                "watch_policy": False,
                "admin": {"token": "surface-admin"},
                "store": {"kind": "memory"},
                "access_log": False,
                "pools": [{"name": "interactive", "models": [MODEL], "backends": [sim.url]}],
                "tenants": tenants,
            },
            environ={},
        )
        yield stack.enter_context(serve(create_app(config)))


def test_a_429_from_the_queue_carries_the_headers_too(one_slot: ServerThread) -> None:
    """A request the queue refuses after its quota was reserved (its deadline cannot be met behind the
    request holding the only slot) still tells the client its rate limits."""
    headers = {"authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(base_url=one_slot.url, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as holding,
    ):
        assert holding.status_code == 200
        chunks = holding.iter_raw()  # kept: a dropped iterator closes the stream
        next(chunks)  # it runs for 400 tokens: the slot is taken
        refused = client.post(
            "/v1/chat/completions",
            json={**body, "stream": False},
            headers={**headers, "x-omnigate-deadline-ms": "1"},
        )
    assert (refused.status_code, refused.json()["error"]["code"]) == (429, "slo_unattainable"), refused.text
    limits = _limits(refused.headers)
    assert limits["x-ratelimit-limit-requests"] == str(RPM)
    assert int(limits["x-ratelimit-remaining-requests"]) in (RPM - 2, RPM - 1)  # both reserved; a refill
    assert limits["x-ratelimit-limit-tokens"] == str(TPM)


def test_a_tenant_over_its_max_queued_is_refused_with_its_own_429(one_slot: ServerThread) -> None:
    """`max_queued: 0`: a request that would have to wait for the only slot is refused at once, with the
    tenant's limits; one that can start at once is served."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 400, "ignore_eos": True, "stream": True}
    no_wait = {"authorization": f"Bearer {NO_WAIT_KEY}"}
    with httpx.Client(base_url=one_slot.url, timeout=30) as client:
        short = {**body, "max_tokens": 3, "stream": False}
        assert client.post("/v1/chat/completions", json=short, headers=no_wait).status_code == 200
        with client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"}
        ) as holding:
            chunks = holding.iter_raw()  # kept: a dropped iterator closes the stream
            next(chunks)  # it runs for 400 tokens: the slot is taken
            refused = client.post("/v1/chat/completions", json=short, headers=no_wait)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "queued_requests_exceeded"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-limit-requests"] == str(RPM)


def test_named_priorities_beside_integers(gateway: ServerThread) -> None:
    client = _client(gateway)
    for asked, effective in (("high", "10"), ("low", "0"), ("7", "7")):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=1, extra_headers={"x-priority": asked}
        )
        assert raw.headers["x-omnigate-priority"] == effective
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=1, extra_headers={"x-priority": "urgent"}
        )
    assert (info.value.code, info.value.param) == ("invalid_header", "x-priority")
    assert "(high, normal, low)" in info.value.message


def test_model_aliases_are_listed_retrieved_and_served(gateway: ServerThread) -> None:
    client = _client(gateway)
    listed = {m.id: getattr(m, "root", None) for m in client.models.list().data}
    assert listed == {ALIAS: MODEL, MODEL: None}
    alias = client.models.retrieve(ALIAS)
    assert (alias.id, alias.object, alias.owned_by, getattr(alias, "root", None)) == (
        ALIAS,
        "model",
        "omnigate",
        MODEL,
    )
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-5")
    assert info.value.code == "model_not_found"
    answer = client.chat.completions.create(model=ALIAS, messages=MESSAGES, max_tokens=2)
    assert answer.model == MODEL  # the engine was sent the served name
    with pytest.raises(openai.AuthenticationError):
        _client(gateway, "sk-nobody").models.retrieve(MODEL)


def test_embeddings_go_through_auth_quota_and_the_queue(gateway: ServerThread) -> None:
    client = _client(gateway)
    counter = PromptCounter(load_profile("default"))
    texts = ["first passage", "a second, longer passage about boats"]
    usage_before = httpx.get(gateway.url + "/v1/usage", headers={"authorization": f"Bearer {KEY}"}).json()
    raw = client.embeddings.with_raw_response.create(model=ALIAS, input=texts)
    result = raw.parse()
    assert [len(d.embedding) for d in result.data] == [64, 64]
    tokens = sum(counter.text(t) for t in texts)
    assert (result.usage.prompt_tokens, result.model) == (tokens, MODEL)
    assert raw.headers["x-omnigate-pool"] == "interactive"
    assert int(raw.headers["x-ratelimit-remaining-requests"]) < RPM
    usage_after = httpx.get(gateway.url + "/v1/usage", headers={"authorization": f"Bearer {KEY}"}).json()
    charged = {
        k: usage_after["today"][k] - usage_before["today"][k] for k in ("input_tokens", "output_tokens")
    }
    assert charged == {"input_tokens": tokens, "output_tokens": 0}  # its cost is its input
    with pytest.raises(openai.AuthenticationError):
        _client(gateway, "sk-nobody").embeddings.create(model=MODEL, input="x")


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"model": MODEL}, "missing_required_parameter", "input"),
        ({"model": MODEL, "input": ""}, "invalid_value", "input"),
        ({"model": MODEL, "input": ["ok", 3]}, "invalid_value", "input[1]"),
        ({"model": MODEL, "input": "x", "stream": True}, "invalid_value", "stream"),
        ({"model": MODEL, "input": "x", "encoding_format": "hex"}, "invalid_value", "encoding_format"),
        ({"model": MODEL, "input": "x", "dimensions": 0}, "invalid_value", "dimensions"),
        ({"model": MODEL, "input": ["x"] * 2049}, "invalid_value", "input"),
    ],
)
def test_bad_embedding_requests_are_one_clear_400(
    gateway: ServerThread, body: dict, code: str, param: str
) -> None:
    r = httpx.post(gateway.url + "/v1/embeddings", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
