"""The sglang-omni server (`kind: sglang-omni`): a staged pipeline behind an OpenAI-style HTTP surface.

Capacity: the Qwen3-Omni speech pipeline as its stages hold requests — the media encoders (a batch of up
to 32 items), the thinker and the talker (continuous-batching engines with their own caps: 16 / 16 in the
snapshot, 64 / 32 later), and the serial code2wav vocoder (audio seconds per second, unknown until
measured). Every request holds the thinker; one with media the encoder; one that speaks the talker and
code2wav — in the snapshot every request of the speech pipeline does, since it fans every request out to the
talker and only its HTTP layer drops the audio. A backend serving the text-only pipeline (no `talker_ar`
among the stages its `/health` lists) has no talker and no code2wav.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from gateway.backends.kinds.base import PROBE_TIMEOUT, BackendKind, Capacity, Stage, StageUnit, Verdict
from gateway.backends.kinds.sglang import judge_status
from gateway.backends.state import BackendState
from gateway.config import OmniVersion, PoolConfig
from gateway.proxy import UpstreamError
from gateway.ticket import Ticket

log = logging.getLogger("omnigate.backends")

ENCODER, THINKER, TALKER, CODE2WAV = "encoder", "thinker", "talker", "code2wav"
TALKER_STAGE = "talker_ar"  # the server's name of the talker stage in /health `stages`
DEFAULT_CAPS: dict[OmniVersion, tuple[int, int]] = {"snapshot": (16, 16), "later": (64, 32)}
"""(thinker, talker) `max_running_requests` per version: `server_args_builder.py` at the snapshot; later
#1024 / #1135 (thinker 64) and #847 (talker 32)."""


class SGLangOmni(BackendKind):
    name = "sglang-omni"

    def __init__(self, config: PoolConfig) -> None:
        server = config.sglang_omni
        self.server = server
        thinker, talker = DEFAULT_CAPS[server.version]
        self.thinker_cap = server.thinker_max_running_requests or thinker
        self.talker_cap = server.talker_max_running_requests or talker
        self.every_request_speaks = server.version == "snapshot"
        self._stages: dict[str, tuple[str, ...]] = {}  # url → the stages its /health lists

    def payload(self, body: dict[str, Any], engine_priority: int) -> bytes:
        body.pop("priority", None)  # the server has no priority; the gateway's order is the only one
        return orjson.dumps(body)

    async def probe(
        self, session: aiohttp.ClientSession, state: BackendState, clock: Callable[[], float]
    ) -> bool:
        try:
            async with session.get(state.url + "/health", timeout=PROBE_TIMEOUT) as resp:
                raw = await resp.read()
                healthy = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False
        if healthy:
            self._read_health(state, raw)
        return healthy

    def _read_health(self, state: BackendState, raw: bytes) -> None:
        try:
            info = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        if not isinstance(info, dict):
            return
        stages = info.get("stages")
        if isinstance(stages, list):
            self._stages[state.url] = tuple(str(s) for s in stages)

    def judge(self, error: UpstreamError) -> Verdict:
        return judge_status(error)

    def speaks(self, state: BackendState) -> bool:
        """The backend runs the speech pipeline (assumed until its /health lists its stages)."""
        stages = self._stages.get(state.url)
        return stages is None or TALKER_STAGE in stages

    def capacity(self, state: BackendState) -> Capacity:
        s = self.server
        stages = [
            Stage(ENCODER, StageUnit.ITEMS_PER_BATCH, s.encoder_max_batch_size),
            Stage(THINKER, StageUnit.REQUESTS, self.thinker_cap),
        ]
        if self.speaks(state):
            stages.append(Stage(TALKER, StageUnit.REQUESTS, self.talker_cap))
            stages.append(Stage(CODE2WAV, StageUnit.AUDIO_SECONDS_PER_S, s.code2wav_audio_seconds_per_s))
        return Capacity(tuple(stages))

    def stages_of(self, ticket: Ticket) -> tuple[str, ...]:
        cost = ticket.cost
        held: list[str] = [ENCODER] if cost.images or cost.audios or cost.videos else []
        held.append(THINKER)
        if ticket.voice is not None or self.every_request_speaks:
            held += (TALKER, CODE2WAV)
        return tuple(held)
