"""The plain SGLang adapter: shaping, how it judges each upstream failure, its capacity model."""

from __future__ import annotations

import uuid

import orjson
import pytest

from gateway.backends.kinds import adapter_for
from gateway.backends.kinds.base import Capacity, Stage, StageUnit
from gateway.backends.kinds.sglang import SGLang
from gateway.backends.state import BackendState
from gateway.relay.proxy import (
    BrokenBeforeFirstByte,
    BrokenMidStream,
    FirstByteTimeout,
    IdleTimeout,
    TotalTimeout,
    TruncatedStream,
    UpstreamConnectError,
    UpstreamStatusError,
)
from gateway.relay.sse import leading_error
from gateway.request.errors import ErrorCode
from gateway.request.ticket import Ticket
from gateway.settings.config import PoolConfig


def _pool(**kw: object) -> PoolConfig:
    return PoolConfig.model_validate({"name": "p", "models": ["m"], "backends": ["http://b:1"], **kw})


def _sglang(**kw: object) -> SGLang:
    kind = adapter_for(_pool(**kw))
    assert isinstance(kind, SGLang)
    return kind


def _state() -> BackendState:
    return BackendState(url="http://b:1", pool="p")


def test_the_pool_kind_names_the_adapter() -> None:
    assert _pool().kind == "sglang"
    assert adapter_for(_pool()).name == "sglang"


def test_payload_drops_a_clients_priority_when_engines_do_not_schedule_by_it() -> None:
    body = {"model": "m", "messages": [], "priority": 99}
    assert orjson.loads(_sglang().payload(body, 5)) == {"model": "m", "messages": []}


def test_payload_sets_the_engine_priority_when_engines_schedule_by_it() -> None:
    kind = _sglang(priority_scheduling=True)
    body = {"model": "m", "priority": 99}
    assert orjson.loads(kind.payload(body, 5)) == {"model": "m", "priority": 5}
    assert orjson.loads(kind.payload(body, 2)) == {"model": "m", "priority": 2}  # per attempt


SGLANG_ERROR = orjson.dumps(
    {"object": "error", "message": "boom", "type": "BadRequestError", "param": None, "code": 400}
)


@pytest.mark.parametrize(
    ("status", "mapped", "retry", "backend_fault", "overloaded", "client_fault"),
    [
        (400, 400, False, False, False, True),
        (404, 404, False, False, False, True),
        (413, 413, False, False, False, True),
        (422, 422, False, False, False, True),
        (429, 429, False, False, True, False),
        (409, 409, False, False, False, True),
        (500, 502, True, True, False, False),
        (501, 502, False, True, False, False),
        (502, 502, True, True, False, False),
        (503, 503, True, False, True, False),
        (504, 502, True, True, False, False),
    ],
)
def test_status_answers(
    status: int, mapped: int, retry: bool, backend_fault: bool, overloaded: bool, client_fault: bool
) -> None:
    verdict = _sglang().judge(UpstreamStatusError(status, SGLANG_ERROR), _state())
    assert (verdict.retry, verdict.backend_fault, verdict.overloaded, verdict.client_fault) == (
        retry,
        backend_fault,
        overloaded,
        client_fault,
    )
    assert verdict.error.status == mapped
    assert verdict.error.body() == {
        "error": {"message": "boom", "type": "BadRequestError", "param": None, "code": "400"}
    }


@pytest.mark.parametrize(
    ("error", "status", "code", "retry"),
    [
        (UpstreamConnectError("no"), 502, ErrorCode.BACKEND_CONNECT, True),
        (BrokenBeforeFirstByte("cut"), 502, ErrorCode.BACKEND_FIRST_BYTE, True),
        (FirstByteTimeout("late"), 504, ErrorCode.BACKEND_FIRST_BYTE, False),
        (TotalTimeout("long"), 504, ErrorCode.BACKEND_TOTAL_TIMEOUT, False),
        (IdleTimeout("quiet"), 504, ErrorCode.UPSTREAM_ERROR, False),
        (BrokenMidStream("cut"), 502, ErrorCode.UPSTREAM_ERROR, False),
        (TruncatedStream("short"), 502, ErrorCode.UPSTREAM_ERROR, False),
    ],
)
def test_transport_failures_are_the_backends_fault(error, status: int, code: ErrorCode, retry: bool) -> None:
    verdict = _sglang().judge(error, _state())
    assert (verdict.retry, verdict.backend_fault, verdict.overloaded, verdict.client_fault) == (
        retry,
        True,
        False,
        False,
    )
    assert (verdict.error.status, verdict.error.code, verdict.error.message) == (status, code, error.message)


@pytest.mark.parametrize(("endpoint", "prefix"), [("chat", "chatcmpl-"), ("completions", "cmpl-")])
def test_each_attempt_gets_a_rid_of_the_gateways_own(endpoint: str, prefix: str) -> None:
    kind, ticket = _sglang(), Ticket(id="r", model="m", stream=False, arrival=0.0, endpoint=endpoint)
    body = {"model": "m", "rid": "a-clients-own"}
    first = kind.name_request(body, ticket)
    assert first is not None and first.startswith(prefix) and len(first) == len(prefix) + 32
    named = uuid.UUID(first.removeprefix(prefix))  # a random UUID's hex, as uuid.uuid4() gives it
    assert (named.version, named.variant, named.hex) == (4, uuid.RFC_4122, first.removeprefix(prefix))
    assert body["rid"] == first and orjson.loads(kind.payload(body, 0))["rid"] == first
    second = kind.name_request(body, ticket)  # a retry is another request to its engine
    assert second is not None and second != first and body["rid"] == second


def test_an_embedding_gets_no_rid_and_keeps_no_clients_own() -> None:
    ticket = Ticket(id="r", model="m", stream=False, arrival=0.0, endpoint="embeddings")
    body = {"model": "m", "input": "x", "rid": "a-clients-own"}
    assert _sglang().name_request(body, ticket) is None and "rid" not in body


def test_capacity_is_one_engine_stage_limited_by_what_the_server_reported() -> None:
    kind = _sglang()
    state = BackendState(url="http://b:1", pool="p")
    assert kind.capacity(state) == Capacity((Stage("engine", StageUnit.REQUESTS, None),))
    state.max_running_requests = 48
    assert kind.capacity(state).stage("engine") == Stage("engine", StageUnit.REQUESTS, 48)
    with pytest.raises(KeyError):
        kind.capacity(state).stage("talker")


def test_every_request_holds_the_engine() -> None:
    ticket = Ticket(id="r", model="m", stream=True, arrival=0.0)
    assert _sglang().stages_of(ticket) == ("engine",)


def test_sglang_aborts_what_its_client_leaves() -> None:
    assert not _sglang().runs_on(Ticket(id="r", model="m", stream=False, arrival=0.0))


def test_a_queued_stream_the_engine_drops_for_a_better_one_is_an_overload_retried_elsewhere() -> None:
    """SGLang 0.5.23 opens the dropped request's stream (200) on one error event (tests/engine's
    contract): the relay takes it as the 503 it says, before any byte reached the client, so another
    backend may run it."""
    event = {
        "error": {
            "object": "error",
            "message": "The request is aborted by a higher priority request.",
            "type": "SERVICE_UNAVAILABLE",
            "param": None,
            "code": 503,
        }
    }
    first = b"data: " + orjson.dumps(event) + b"\n\ndata: [DONE]\n\n"
    refused = leading_error(first)
    assert refused == (503, orjson.dumps(event))
    verdict = _sglang().judge(UpstreamStatusError(*refused), _state())
    assert (verdict.retry, verdict.backend_fault, verdict.overloaded, verdict.client_fault) == (
        True,
        False,
        True,
        False,
    )
    assert verdict.error.status == 503
    assert verdict.error.body()["error"]["message"] == "The request is aborted by a higher priority request."
