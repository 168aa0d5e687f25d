"""The sglang-omni adapter's capacity model: its stages per version and what each request holds."""

from __future__ import annotations

import orjson
import pytest

from gateway.backends.kinds import adapter_for
from gateway.backends.kinds.base import Capacity, Stage, StageUnit
from gateway.backends.kinds.sglang_omni import SGLangOmni
from gateway.backends.state import BackendState
from gateway.config import ConfigError, PoolConfig, parse_config
from gateway.ticket import Cost, Ticket


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
