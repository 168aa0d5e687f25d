"""The sglang-omni server (`kind: sglang-omni`): a staged pipeline behind an OpenAI-style HTTP surface.

Capacity: the Qwen3-Omni speech pipeline as its stages hold requests — the media encoders (a batch of up
to 32 items), the thinker and the talker (continuous-batching engines with their own caps: 16 / 16 in the
snapshot, 64 / 32 later), and the serial code2wav vocoder (audio seconds per second, unknown until
measured). Every request holds the thinker; one with media the encoder; one that speaks the talker and
code2wav — in the snapshot every request of the speech pipeline does, since it fans every request out to the
talker and only its HTTP layer drops the audio. A backend serving the text-only pipeline (no `talker_ar`
among the stages its `/health` lists) has no talker and no code2wav.

Shaping: the snapshot reads media only from the top-level `images` / `videos` / `audios` lists (it would
`json.dumps` OpenAI content parts into the prompt), so media parts move there (`shapes.py`); later servers
read both shapes. `priority` is dropped: the server has none.

Failures (0.1.9, `version: later`): a full queue is 503 `The request queue is full.` before the answer, and
inside a started stream an error event carrying it (code 503 on chat, none on speech SSE: the message tells
it); a started PCM speech stream that fails just drops. The first is retried elsewhere, the second is the
server's overload (never the client's fault), a drop is the server's failure. A raw PCM stream carries no
usage: it is read afterwards from `GET /v1/audio/speech/{x-sglang-omni-speech-id}`.

Load signals: the coordinator's snapshot in the `/health` JSON every tick — `total_requests` (every request
the pipeline still runs, all clients, also those whose client left) and `pending_completions` (those a
handler still waits for) — and the stages it lists. `/metrics` (`--enable-metrics`, `sglang_omni_*`) carries
the same snapshot; it is read only when a /health body lacks the counts. The server has no KV and no queue
signal: admission runs on its own accounting there, and `/admin/state` says so. Newer servers run a stage as
replicas named `stage@rN` (`pipeline/replicas.py`): a stage's cap counts once per replica.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import aiohttp
import orjson

from gateway.backends.kinds.base import (
    PROBE_TIMEOUT,
    BackendKind,
    Capacity,
    Signal,
    Stage,
    StageUnit,
    Verdict,
    exchange_failed,
    get_health,
)
from gateway.backends.kinds.errors import upstream_error
from gateway.backends.kinds.sglang import OVERLOAD_STATUS, RETRYABLE_STATUS
from gateway.backends.kinds.sglang_omni_scrape import read_omni_metrics
from gateway.backends.kinds.shapes import to_media_lists
from gateway.backends.state import BackendState
from gateway.relay.proxy import (
    BrokenMidStream,
    CutAfterHeaders,
    TruncatedStream,
    UpstreamError,
    UpstreamStatusError,
)
from gateway.request.errors import ApiError, ErrorCode
from gateway.request.ticket import Ticket
from gateway.settings.config import OmniVersion, PoolConfig

log = logging.getLogger("omnigate.backends")

ENCODER, THINKER, TALKER, CODE2WAV = "encoder", "thinker", "talker", "code2wav"
TALKER_STAGE = "talker_ar"  # the server's name of the talker stage in /health `stages`
THINKER_STAGE = "thinker"
REPLICA_SEPARATOR = "@r"  # `pipeline/replicas.py`: replica N of stage S is listed as `S@rN`
QUEUE_FULL = "The request queue is full."  # `QueueFullError.MESSAGE`, whatever status carries it
SPEECH_ID = "x-sglang-omni-speech-id"  # a PCM stream's id for GET /v1/audio/speech/{id}
CUT = (CutAfterHeaders, BrokenMidStream, TruncatedStream)
"""How a stream whose request fails ends on sglang-omni: its handler has sent the 200 before the pipeline
runs, and a failure then closes the connection — no error event, no [DONE]."""
DEFAULT_CAPS: dict[OmniVersion, tuple[int, int]] = {"snapshot": (16, 16), "later": (64, 32)}
"""(thinker, talker) `max_running_requests` per version: `server_args_builder.py` at the snapshot; later
#1024 / #1135 (thinker 64) and #847 (talker 32)."""


class SGLangOmni(BackendKind):
    name = "sglang-omni"
    staged = True
    routes = frozenset({"/v1/chat/completions", "/v1/audio/speech"})  # no /v1/completions (404 there)
    unavailable = MappingProxyType(
        {
            Signal.KV_CAPACITY: "sglang-omni exposes no KV signal",
            Signal.KV_USAGE: "sglang-omni exposes no KV signal",
            Signal.QUEUED: "sglang-omni does not report its stages' queues",
        }
    )

    def __init__(self, config: PoolConfig) -> None:
        server = config.sglang_omni
        self.server = server
        thinker, talker = DEFAULT_CAPS[server.version]
        self.thinker_cap = server.thinker_max_running_requests or thinker
        self.talker_cap = server.talker_max_running_requests or talker
        self.every_request_speaks = server.version == "snapshot"
        self.aborts = server.version == "later"  # 0.1.9 aborts whatever its client leaves, whole or streamed
        self.lists_only = server.version == "snapshot"  # OpenAI content parts became prompt text there
        self._stages: dict[str, tuple[str, ...]] = {}  # url → the stages its /health lists
        self._no_metrics: set[str] = set()  # backends without /metrics, until they are down once
        self._no_audio: set[str] = set()  # backends whose /metrics has no audio histograms

    def payload(self, body: dict[str, Any], engine_priority: int) -> bytes:
        body.pop("priority", None)  # the server has no priority; the gateway's order is the only one
        if self.lists_only:
            to_media_lists(body)
        return orjson.dumps(body)

    async def probe(
        self, session: aiohttp.ClientSession, state: BackendState, clock: Callable[[], float]
    ) -> bool:
        healthy, raw = await get_health(session, state.url)
        if not healthy:
            self._no_metrics.discard(state.url)  # a server that comes back may have been restarted
            self._no_audio.discard(state.url)
            return False
        counted = self._read_health(state, raw)
        wanted = not counted or state.url not in self._no_audio  # the counts, or the server's audio view
        if wanted and state.url not in self._no_metrics:
            try:
                await self._scrape(session, state, clock)
            except (aiohttp.ClientError, TimeoutError) as e:
                log.debug("scrape of %s failed: %s", state.name, e)
        return True

    def _read_health(self, state: BackendState, raw: bytes) -> bool:
        """The coordinator's snapshot from a /health body; True when it held the request counts."""
        try:
            info = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(info, dict):
            return False
        stages = info.get("stages")
        if isinstance(stages, list):
            self._stages[state.url] = tuple(str(s) for s in stages)
        return _apply_counts(state, info.get("total_requests"), info.get("pending_completions"))

    async def _scrape(
        self, session: aiohttp.ClientSession, state: BackendState, clock: Callable[[], float]
    ) -> None:
        """The same snapshot from `/metrics` (`--enable-metrics`), for a /health body without it."""
        async with session.get(state.url + "/metrics", timeout=PROBE_TIMEOUT) as resp:
            if resp.status == 404:
                self._no_metrics.add(state.url)
                return
            if resp.status != 200:
                return
            text = (await resp.read()).decode("utf-8", "replace")
        try:
            gauges = read_omni_metrics(text)
        except ValueError as e:
            log.debug("scrape of %s failed: %s", state.name, e)
            return
        if gauges.stages:
            self._stages[state.url] = gauges.stages
        if gauges.audio is None:
            self._no_audio.add(state.url)
        state.server_audio = gauges.audio
        if _apply_counts(state, gauges.tracked, gauges.pending):
            state.last_scrape = clock()

    def judge(self, error: UpstreamError, backend: BackendState) -> Verdict:
        if isinstance(error, UpstreamStatusError):
            return self._answered(error, backend)
        if isinstance(error, CUT) and self.aborts:  # 0.1.9 tells failures in-band: a drop is the server's
            return exchange_failed(error)
        if isinstance(error, CUT) and backend.healthy:
            return _own_failure(
                ApiError(
                    422,
                    "The backend cut the stream: the request failed there (sglang-omni gives no reason).",
                    code=ErrorCode.BACKEND_REQUEST_FAILED,
                )
            )
        return exchange_failed(error)

    def _answered(self, error: UpstreamStatusError, backend: BackendState) -> Verdict:
        status = error.status
        mapped = upstream_error(status, error.body)
        if status == 500 and backend.healthy:
            return _own_failure(
                ApiError(
                    422,
                    f"The backend could not process this request: {mapped.message}",
                    code=ErrorCode.BACKEND_REQUEST_FAILED,
                )
            )
        if status in OVERLOAD_STATUS:  # later servers: 503 "The request queue is full." (#1449), 429 (#772)
            return Verdict(mapped, retry=True, backend_fault=False, overloaded=True, client_fault=False)
        if status < 500:
            return _own_failure(mapped)
        return Verdict(
            mapped, retry=status in RETRYABLE_STATUS, backend_fault=True, overloaded=False, client_fault=False
        )

    def judge_event(self, error: dict[str, Any], backend: BackendState) -> Verdict:
        """A full queue is told by its message too: a speech SSE error event carries no status code."""
        verdict = super().judge_event(error, backend)
        if verdict.overloaded or not str(error.get("message") or "").startswith(QUEUE_FULL):
            return verdict
        api = ApiError(503, QUEUE_FULL, code=ErrorCode.UPSTREAM_ERROR)
        return Verdict(api, retry=False, backend_fault=False, overloaded=True, client_fault=False)

    async def stream_usage(
        self, session: aiohttp.ClientSession, state: BackendState, headers: Mapping[str, str]
    ) -> tuple[int, int] | None:
        """A finished PCM stream's usage from `GET /v1/audio/speech/{id}` (0.1.9's outcome route)."""
        speech_id = headers.get(SPEECH_ID)
        if not speech_id:
            return None
        try:
            async with session.get(f"{state.url}/v1/audio/speech/{speech_id}", timeout=PROBE_TIMEOUT) as resp:
                if resp.status != 200:
                    return None
                outcome = orjson.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as e:
            log.debug("speech outcome of %s on %s not read: %s", speech_id, state.name, e)
            return None
        usage = outcome.get("usage") if isinstance(outcome, dict) else None
        if not isinstance(usage, dict):
            return None
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)

    def runs_on(self, ticket: Ticket) -> bool:
        """The snapshot never aborts a request whose client left (`Coordinator.stream` and `submit` never call
        `abort()`); 0.1.9 aborts every one (streams in `Coordinator.stream`'s `finally`, whole chat in
        `complete_unless_disconnected`, whole speech in `await_speech_response`)."""
        return not self.aborts

    def ends_with_text(self, ticket: Ticket) -> bool:
        return TALKER not in self.stages_of(ticket)

    def speaks(self, state: BackendState) -> bool:
        """The backend runs the speech pipeline (assumed until its /health lists its stages)."""
        stages = self._stages.get(state.url)
        return stages is None or self.replicas(state, TALKER_STAGE) > 0

    def replicas(self, state: BackendState, stage: str) -> int:
        """How many processes run `stage` on the backend: its `stage@rN` replicas, 1 for a plain name (and
        while its stages are unknown)."""
        stages = self._stages.get(state.url)
        if stages is None:
            return 1
        return sum(1 for s in stages if s.split(REPLICA_SEPARATOR, 1)[0] == stage)

    def capacity(self, state: BackendState) -> Capacity:
        s = self.server
        stages = [
            Stage(ENCODER, StageUnit.ITEMS_PER_BATCH, s.encoder_max_batch_size),
            Stage(
                THINKER, StageUnit.REQUESTS, self.thinker_cap * max(1, self.replicas(state, THINKER_STAGE))
            ),
        ]
        if self.speaks(state):
            stages.append(
                Stage(TALKER, StageUnit.REQUESTS, self.talker_cap * self.replicas(state, TALKER_STAGE))
            )
            stages.append(Stage(CODE2WAV, StageUnit.AUDIO_SECONDS_PER_S, s.code2wav_audio_seconds_per_s))
        return Capacity(tuple(stages))

    def stages_of(self, ticket: Ticket) -> tuple[str, ...]:
        cost = ticket.cost
        held: list[str] = [ENCODER] if cost.images or cost.audios or cost.videos else []
        held.append(THINKER)
        if ticket.voice is not None or self.every_request_speaks:
            held += (TALKER, CODE2WAV)
        return tuple(held)


def _apply_counts(state: BackendState, tracked: Any, pending: Any) -> bool:
    """Requests the pipeline tracks (every client's, until all their terminal stages are done, whether or
    not anyone still listens) and, of those, the ones no handler waits for: a stream whose client left."""
    if not isinstance(tracked, int) or isinstance(tracked, bool) or tracked < 0:
        return False
    state.running_reqs = tracked
    if isinstance(pending, int) and not isinstance(pending, bool):
        state.detached_reqs = max(0, tracked - pending)
    return True


def _own_failure(error: ApiError) -> Verdict:
    """The request's own failure: not tried elsewhere (it would fail there the same way, after costing
    that backend's encoders and thinker), not the backend's fault, the client's outcome."""
    return Verdict(error, retry=False, backend_fault=False, overloaded=False, client_fault=True)
