"""The blocking reasons' rules: which let the queue behind pass, which a loan may cause, which the shield."""

from __future__ import annotations

import orjson
import pytest

from gateway.admission.blocks import Block


def test_only_own_constraints_let_the_requests_behind_pass() -> None:
    passable = {b for b in Block if b.passable}
    assert passable == {Block.TENANT_SHARE, Block.SHIELD_DUTY, Block.STAGE_TALKER, Block.STAGE_CODE2WAV}


def test_a_loan_may_hold_only_slots_kv_and_bucket_places() -> None:
    reclaimable = {b for b in Block if b.reclaimable}
    assert reclaimable == {
        Block.CONCURRENCY,
        Block.BAND_RESERVE,
        Block.TENANT_SHARE,
        Block.KV_WATERMARK,
        Block.BUCKET_CAP,
    }


def test_the_shield_family_and_the_speaking_stages() -> None:
    assert {b for b in Block if b.shield} == {Block.PREFILL_SHIELD, Block.SHIELD_DUTY}
    assert {b for b in Block if b.speaking} == {Block.STAGE_TALKER, Block.STAGE_CODE2WAV}


@pytest.mark.parametrize("name", ["engine", "encoder", "thinker", "talker", "code2wav"])
def test_every_stage_of_the_kinds_has_a_block(name: str) -> None:
    assert Block.stage(name).value == f"stage_{name}"


def test_an_unknown_stage_is_an_error_not_a_new_reason() -> None:
    with pytest.raises(ValueError):
        Block.stage("vocoder")


def test_admin_state_shows_the_plain_names() -> None:
    assert orjson.loads(orjson.dumps({"*": Block.ROUND_PREFILL})) == {"*": "round_prefill"}
