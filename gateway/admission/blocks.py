"""Why a waiting request does not go to a backend now: one vocabulary, each reason carrying its rules.

The dispatcher's head-of-line rule, lending's reclaim and the shield's memory each ask a property of the
reason instead of keeping their own set of names, so a new reason states once what it lets pass; the
values are the strings `/admin/state` shows under `head.blocked_by`.
"""

from __future__ import annotations

from enum import StrEnum


class Block(StrEnum):
    WINDOW = "window"  # an accumulating pool holds its queue (window.py)
    UNAVAILABLE = "unavailable"  # the backend is down or its circuit is open
    EXCLUDED = "excluded"  # the request already failed there
    BUCKET_CAP = "bucket_cap"  # its modality bucket is at its cap there
    CONCURRENCY = "concurrency"  # the backend's concurrency limit
    BAND_RESERVE = "band_reserve"  # the slots kept for higher bands
    TENANT_SHARE = "tenant_share"  # its tenant holds its share of the band's slots
    ROUND_PREFILL = "round_prefill"  # the round's prefill budget is spent
    PREFILL_SHIELD = "prefill_shield"  # the shield protects a higher rank's first token
    SHIELD_DUTY = "shield_duty"  # a big lower-ranked prompt waits for its spaced turn
    KV_WATERMARK = "kv_watermark"  # its KV tokens would lift the backend over the watermark
    STAGE_ENGINE = "stage_engine"
    STAGE_ENCODER = "stage_encoder"
    STAGE_THINKER = "stage_thinker"
    STAGE_TALKER = "stage_talker"  # speaking stages: only speaking requests wait for them
    STAGE_CODE2WAV = "stage_code2wav"

    @classmethod
    def stage(cls, name: str) -> Block:
        """The block of a staged backend's stage `name` (the kinds' capacity model names them)."""
        return cls(f"stage_{name}")

    @property
    def passable(self) -> bool:
        """The requests behind it may go: it is held back by its own tenant's share, its spaced turn or a
        speaking stage, not by a budget the others share (the dispatcher's head-of-line rule)."""
        return self in (Block.TENANT_SHARE, Block.SHIELD_DUTY) or self.speaking

    @property
    def speaking(self) -> bool:
        """A speaking stage (talker, code2wav) is full: the request waits for a stream to end, which no
        slot turnover predicts; text-only requests never wait for it."""
        return self in (Block.STAGE_TALKER, Block.STAGE_CODE2WAV)

    @property
    def reclaimable(self) -> bool:
        """A loan on the backend may hold what it lacks, so revoking one can free it (lending)."""
        return self in _RECLAIMABLE

    @property
    def shield(self) -> bool:
        """The prefill shield's family refused it: a first byte may lift that (shield.py)."""
        return self in (Block.PREFILL_SHIELD, Block.SHIELD_DUTY)


_RECLAIMABLE = frozenset(
    {Block.CONCURRENCY, Block.BAND_RESERVE, Block.TENANT_SHARE, Block.KV_WATERMARK, Block.BUCKET_CAP}
)
