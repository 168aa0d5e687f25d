"""The sglang-omni adapter's capacity model: its stages per version and what each request holds."""

from __future__ import annotations

import orjson
import pytest

from gateway.backends.kinds import adapter_for
from gateway.backends.kinds.base import Capacity, Stage, StageUnit, Verdict
from gateway.backends.kinds.sglang_omni import SGLangOmni
from gateway.backends.kinds.sglang_omni_scrape import OmniGauges, read_omni_metrics
from gateway.backends.state import BackendState
from gateway.relay.proxy import (
    BrokenBeforeFirstByte,
    BrokenMidStream,
    CutAfterHeaders,
    FirstByteTimeout,
    IdleTimeout,
    TruncatedStream,
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
)
from gateway.request.errors import ApiError
from gateway.request.ticket import Cost, Ticket
from gateway.settings.config import ConfigError, PoolConfig, parse_config


def _pool(**kw: object) -> PoolConfig:
    base = {"name": "speech", "kind": "sglang-omni", "models": ["m"], "backends": ["http://b:1"]}
    return PoolConfig.model_validate({**base, **kw})


def _omni(**server: object) -> SGLangOmni:
    kind = adapter_for(_pool(sglang_omni=server) if server else _pool())
    assert isinstance(kind, SGLangOmni)
    return kind


def _state() -> BackendState:
    return BackendState(url="http://b:1", pool="speech")


def _ticket(voice: str | None = None, **cost: int) -> Ticket:
    return Ticket(id="r", model="m", stream=True, arrival=0.0, voice=voice, cost=Cost(**cost))


SPEECH = ("encoder", "thinker", "talker", "code2wav")


@pytest.mark.parametrize(("version", "thinker", "talker"), [("snapshot", 16, 16), ("later", 64, 32)])
def test_the_stages_and_limits_are_the_versions_defaults(version: str, thinker: int, talker: int) -> None:
    assert _omni(version=version).capacity(_state()) == Capacity(
        (
            Stage("encoder", StageUnit.ITEMS_PER_BATCH, 32),
            Stage("thinker", StageUnit.REQUESTS, thinker),
            Stage("talker", StageUnit.REQUESTS, talker),
            Stage("code2wav", StageUnit.AUDIO_SECONDS_PER_S, None),
        )
    )


def test_the_snapshot_is_the_default_version() -> None:
    assert _pool().sglang_omni.version == "snapshot"
    assert _omni().capacity(_state()).stage("thinker").limit == 16


def test_a_servers_overrides_replace_the_defaults() -> None:
    kind = _omni(
        version="later",
        thinker_max_running_requests=48,
        talker_max_running_requests=8,
        encoder_max_batch_size=16,
        code2wav_audio_seconds_per_s=12.5,
    )
    limits = {s.name: s.limit for s in kind.capacity(_state()).stages}
    assert limits == {"encoder": 16, "thinker": 48, "talker": 8, "code2wav": 12.5}


def test_a_text_only_pipeline_has_no_talker_and_no_vocoder() -> None:
    kind = _omni()
    state = _state()
    text_only = ["preprocessing", "thinker", "decode"]
    kind._read_health(state, orjson.dumps({"running": True, "stages": text_only}))
    assert [s.name for s in kind.capacity(state).stages] == ["encoder", "thinker"]
    speech = ["thinker", "talker_ar", "code2wav"]
    kind._read_health(state, orjson.dumps({"running": True, "stages": speech}))
    assert [s.name for s in kind.capacity(state).stages] == list(SPEECH)


def test_a_later_server_runs_text_answers_on_the_thinker_only() -> None:
    kind = _omni(version="later")
    assert kind.stages_of(_ticket()) == ("thinker",)
    assert kind.stages_of(_ticket(images=2)) == ("encoder", "thinker")
    assert kind.stages_of(_ticket(voice="default")) == ("thinker", "talker", "code2wav")
    assert kind.stages_of(_ticket(voice="Chelsie", audios=1)) == SPEECH


def test_the_snapshot_runs_every_request_through_the_talker() -> None:
    kind = _omni(version="snapshot")
    assert kind.stages_of(_ticket()) == ("thinker", "talker", "code2wav")
    assert kind.stages_of(_ticket(videos=1)) == SPEECH


def test_payload_drops_priority_the_server_has_none() -> None:
    body = {"model": "m", "messages": [], "priority": 3}
    assert orjson.loads(_omni().payload(body, 7)) == {"model": "m", "messages": []}


def _refusal(pool: dict[str, object]) -> str:
    entry = {"name": "p", "models": ["m"], "backends": ["http://b:1"], **pool}
    with pytest.raises(ConfigError) as e:
        parse_config({"pools": [entry]}, environ={})
    return str(e.value)


def test_omni_settings_belong_to_an_omni_pool() -> None:
    assert _refusal({"sglang_omni": {"version": "later"}}) == (
        "<config>: pools.0: Value error, pool 'p': sglang_omni settings need kind: sglang-omni"
    )


def test_an_omni_pool_cannot_schedule_by_priority() -> None:
    assert _refusal({"kind": "sglang-omni", "priority_scheduling": True}) == (
        "<config>: pools.0: Value error, pool 'p': sglang-omni has no priority scheduling"
    )


def test_an_unknown_version_is_refused() -> None:
    assert _refusal({"kind": "sglang-omni", "sglang_omni": {"version": "2.0"}}) == (
        "<config>: pools.0.sglang_omni.version: Input should be 'snapshot' or 'later'"
    )


DETAIL = orjson.dumps({"detail": "Preprocessing failed: cannot identify image file"})


def _judge(error: UpstreamError, healthy: bool = True, version: str = "snapshot") -> Verdict:
    state = _state()
    state.healthy = healthy
    return _omni(version=version).judge(error, state)


def _flags(v: Verdict) -> tuple[bool, bool, bool, bool]:
    return (v.retry, v.backend_fault, v.overloaded, v.client_fault)


@pytest.mark.parametrize("version", ["snapshot", "later"])
@pytest.mark.parametrize("body", [DETAIL, b"Internal Server Error"])
def test_a_500_from_a_healthy_server_is_the_requests_own_failure(version: str, body: bytes) -> None:
    v = _judge(UpstreamStatusError(500, body), version=version)
    assert _flags(v) == (False, False, False, True)
    message = (
        "Preprocessing failed: cannot identify image file" if body == DETAIL else "Backend returned HTTP 500."
    )
    assert v.error.body() == {
        "error": {
            "message": f"The backend could not process this request: {message}",
            "type": "invalid_request_error",
            "param": None,
            "code": "backend_request_failed",
        }
    }
    assert v.error.status == 422


def test_a_500_from_a_server_whose_last_probe_failed_is_the_servers() -> None:
    v = _judge(UpstreamStatusError(500, DETAIL), healthy=False)
    assert _flags(v) == (True, True, False, False)
    assert (v.error.status, v.error.message) == (502, "Preprocessing failed: cannot identify image file")


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (503, {"detail": "The request queue is full."}, "The request queue is full."),
        (429, {"error": {"message": "admission: no free GPU memory", "type": "rate_limit_error"}}, None),
    ],
)
def test_overload_answers_are_tried_elsewhere_and_never_counted(
    status: int, body: dict, message: str | None
) -> None:
    v = _judge(UpstreamStatusError(status, orjson.dumps(body)), version="later")
    assert _flags(v) == (True, False, True, False)
    assert v.error.status == status
    assert v.error.message == (message or "admission: no free GPU memory")


@pytest.mark.parametrize(("status", "mapped"), [(400, 400), (404, 404), (409, 409), (422, 422)])
def test_a_refused_request_is_the_clients(status: int, mapped: int) -> None:
    v = _judge(UpstreamStatusError(status, orjson.dumps({"detail": "no"})), version="later")
    assert _flags(v) == (False, False, False, True)
    assert (v.error.status, v.error.message) == (mapped, "no")


@pytest.mark.parametrize(("status", "retry"), [(501, False), (502, True), (504, True)])
def test_other_server_errors_are_the_servers(status: int, retry: bool) -> None:
    v = _judge(UpstreamStatusError(status, b""))
    assert _flags(v) == (retry, True, False, False)
    assert v.error.status == 502


@pytest.mark.parametrize(
    "error",
    [CutAfterHeaders("cut"), BrokenMidStream("cut"), TruncatedStream("short")],
)
def test_a_cut_stream_from_a_healthy_server_is_the_requests_own_failure(error: UpstreamError) -> None:
    v = _judge(error)
    assert _flags(v) == (False, False, False, True)
    assert (v.error.status, v.error.code) == (422, "backend_request_failed")
    assert (
        v.error.message
        == "The backend cut the stream: the request failed there (sglang-omni gives no reason)."
    )
    assert _flags(_judge(error, healthy=False)) == (error.retryable, True, False, False)


@pytest.mark.parametrize(
    "error",
    [UpstreamConnectError("no"), BrokenBeforeFirstByte("reset"), FirstByteTimeout("late"), IdleTimeout("q")],
)
def test_a_failed_exchange_is_the_servers(error: UpstreamError) -> None:
    v = _judge(error)
    assert _flags(v) == (error.retryable, True, False, False)
    assert (v.error.status, v.error.message) == (error.status, error.message)


HEALTH = {
    "status": "healthy",
    "running": True,
    "stages": ["preprocessing", "thinker", "talker_ar", "code2wav"],
    "entry_stage": "preprocessing",
    "total_requests": 7,
    "pending_completions": 5,
    "request_states": {"running": 6, "pending": 1},
}


def test_the_health_snapshot_gives_running_and_detached_requests() -> None:
    state = _state()
    assert _omni()._read_health(state, orjson.dumps(HEALTH))
    assert (state.running_reqs, state.detached_reqs, state.queue_reqs) == (7, 2, None)


@pytest.mark.parametrize("raw", [b"", b"OK", b"[1]", orjson.dumps({"running": True, "total_requests": "7"})])
def test_a_health_body_without_counts_leaves_them_unknown(raw: bytes) -> None:
    state = _state()
    assert not _omni()._read_health(state, raw)
    assert (state.running_reqs, state.detached_reqs) == (None, None)


def test_missing_signals_say_why_and_what_admission_does_without_them() -> None:
    state = _state()
    kind = _omni()
    kind._read_health(state, orjson.dumps(HEALTH))
    assert kind.missing_signals(state) == {
        "kv_capacity": "sglang-omni exposes no KV signal: the KV watermark is off",
        "kv_usage": "sglang-omni exposes no KV signal: KV in use counts only the gateway's own reservations",
        "queued": "sglang-omni does not report its stages' queues: the backend's own queue is not seen",
    }
    assert _omni().missing_signals(_state())["running"] == (
        "not read from the backend yet: other clients' requests are not seen"
    )


OMNI_METRICS = """# HELP sglang_omni_pipeline_running Whether the pipeline is running.
# TYPE sglang_omni_pipeline_running gauge
sglang_omni_pipeline_running{model_name="m"} 1.0
# TYPE sglang_omni_pipeline_tracked_requests gauge
sglang_omni_pipeline_tracked_requests{model_name="m"} 4.0
# TYPE sglang_omni_pipeline_pending_completions gauge
sglang_omni_pipeline_pending_completions{model_name="m"} 3.0
# TYPE sglang_omni_request_states gauge
sglang_omni_request_states{model_name="m",state="running"} 4.0
# TYPE sglang_omni_stage_present gauge
sglang_omni_stage_present{model_name="m",stage="code2wav"} 0.0
sglang_omni_stage_present{model_name="m",stage="thinker"} 1.0
# TYPE sglang_omni_http_requests_total counter
sglang_omni_http_requests_total{method="GET",model_name="m",route="/health",status="200"} 12.0
"""


def test_the_metrics_carry_the_same_snapshot() -> None:
    assert read_omni_metrics(OMNI_METRICS) == OmniGauges(tracked=4, pending=3, stages=("thinker",))
    assert read_omni_metrics("") == OmniGauges()


def test_what_runs_on_after_the_client_leaves() -> None:
    snapshot, later = _omni(version="snapshot"), _omni(version="later")
    stream, whole = _ticket(), Ticket(id="w", model="m", stream=False, arrival=0.0)
    assert (snapshot.runs_on(stream), snapshot.runs_on(whole)) == (True, True)  # it never aborts
    assert (later.runs_on(stream), later.runs_on(whole)) == (False, False)  # 0.1.9 aborts both
    assert not snapshot.ends_with_text(stream)  # the talker speaks every answer there
    assert later.ends_with_text(stream) and not later.ends_with_text(_ticket(voice="default"))


def test_each_kind_names_the_routes_its_servers_have() -> None:
    assert SGLangOmni.routes == {"/v1/chat/completions", "/v1/audio/speech"}
    _omni().check_route("/v1/chat/completions", "m")
    with pytest.raises(ApiError) as e:
        _omni().check_route("/v1/completions", "m")
    assert (e.value.status, e.value.code) == (404, "route_not_served")
    adapter_for(
        PoolConfig.model_validate({"name": "p", "models": ["m"], "backends": ["http://b:1"]})
    ).check_route("/v1/completions", "m")
