"""A continuous-batching engine on a virtual clock, scheduled the way SGLang's scheduler does it.

Pure and synchronous: `submit`, `abort` and `step` change state and advance `now`; nothing sleeps.
One `step()` is one forward pass — a prefill batch if the admission rules let one form (prefill
before decode, as SGLang's `get_next_batch_to_run`), otherwise one decode step of the running batch.

Admission follows SGLang's `PrefillAdder`: a new request needs its prompt plus its full clipped output
budget free, after every running request's remaining budget × `new_token_ratio` is set aside. The ratio
starts at 0.7 × conservativeness, decays each decode step towards 0.14 × that, is recomputed from the
batch's real progress after a retraction, and resets when the engine goes idle. On KV overflow in decode
the request with the fewest output tokens (ties: longest prompt) is retracted first, repeatedly, until
the batch fits — or, with `oom_mode="crash"`, every request fails and the engine refuses work for
`restart_s`.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from loadtest.sim.profile import CostModel, PrefillChunk

CLIP_MAX_NEW_TOKENS = 4096
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
THROUGHPUT_WINDOW_S = 5.0

QUEUE_FULL_MESSAGE = "The request queue is full."
CRASH_MESSAGE = "CUDA out of memory while decoding: the scheduler process crashed and is restarting."
RESTARTING_MESSAGE = "The server is restarting after a crash."


class EngineError(Exception):
    """A request the engine refuses or fails, with the HTTP status SGLang would answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_total_tokens: int
    max_running_requests: int
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int = 8192  # <= 0 disables chunking
    schedule_policy: Literal["fcfs", "priority"] = "fcfs"
    schedule_conservativeness: float = 1.0
    max_queued_requests: int | None = None
    oom_mode: Literal["retract", "crash"] = "retract"
    restart_s: float = 30.0


@dataclass(eq=False)
class SimRequest:
    """One generation request; the engine owns the fields below `arrival`."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    output_len: int  # tokens it would produce before a natural stop; capped by max_new_tokens
    encoder_tokens: int = 0  # image/audio/video tokens the encoders must produce at (re)prefill
    priority: int = 0
    arrival: float = 0.0
    generated: int = 0
    kv: int = 0
    admitted_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_at: float | None = None
    finish_reason: str | None = None  # stop | length | abort | error
    error: EngineError | None = None
    retractions: int = 0
    queue_seq: int = 0

    @property
    def fill_len(self) -> int:
        """Tokens that must sit in the KV cache before the next token: prompt plus output so far."""
        return self.prompt_tokens + self.generated

    @property
    def remaining_budget(self) -> int:
        return min(max(self.max_new_tokens - self.generated, 0), CLIP_MAX_NEW_TOKENS)

    @property
    def done(self) -> bool:
        return self.generated >= min(self.output_len, self.max_new_tokens)

    @property
    def first_token_at(self) -> float | None:
        return self.token_times[0] if self.token_times else None


@dataclass
class StepResult:
    kind: Literal["prefill", "decode", "crash"]
    start: float
    end: float
    emitted: list[SimRequest] = field(default_factory=list)
    finished: list[SimRequest] = field(default_factory=list)
    retracted: list[SimRequest] = field(default_factory=list)
    failed: list[SimRequest] = field(default_factory=list)
    prefill_tokens: int = 0


class Engine:
    def __init__(self, config: EngineConfig, costs: CostModel, start: float = 0.0) -> None:
        self.config = config
        self.costs = costs
        self.now = start
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.chunked: SimRequest | None = None
        self.used_tokens = 0
        self.init_new_token_ratio = min(INIT_NEW_TOKEN_RATIO * config.schedule_conservativeness, 1.0)
        self.min_new_token_ratio = min(self.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.new_token_ratio_decay = (
            self.init_new_token_ratio - self.min_new_token_ratio
        ) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_new_token_ratio
        self.crashed_until: float | None = None
        self.total_retracted = 0
        self.total_aborted = 0
        self.total_crashes = 0
        self._seq = itertools.count()
        self._recent_decode: deque[tuple[float, int]] = deque()

    # -- requests in and out ---------------------------------------------------------------------------
    def submit(self, req: SimRequest) -> None:
        if self.is_crashed():
            raise EngineError(503, RESTARTING_MESSAGE)
        limit = self.config.max_queued_requests
        if limit is not None and len(self.waiting) >= limit:
            raise EngineError(503, QUEUE_FULL_MESSAGE)
        self._enqueue(req)

    def abort(self, rid: str) -> SimRequest | None:
        """Remove a request wherever it is and free its KV (SGLang's abort on client disconnect)."""
        for group in (self.waiting, self.running):
            for req in group:
                if req.rid == rid:
                    group.remove(req)
                    return self._finish_aborted(req)
        if self.chunked is not None and self.chunked.rid == rid:
            req, self.chunked = self.chunked, None
            return self._finish_aborted(req)
        return None

    # -- state -------------------------------------------------------------------------------------
    @property
    def free_tokens(self) -> int:
        return self.config.max_total_tokens - self.used_tokens

    @property
    def num_running(self) -> int:
        return len(self.running) + (1 if self.chunked is not None else 0)

    def is_crashed(self) -> bool:
        if self.crashed_until is not None and self.now >= self.crashed_until:
            self.crashed_until = None
        return self.crashed_until is not None

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.chunked)

    def next_event_time(self) -> float | None:
        """When a step could run: now if any request is eligible, else the next future arrival."""
        if self.running or self.chunked or any(r.arrival <= self.now for r in self.waiting):
            return self.now
        return min((r.arrival for r in self.waiting), default=None)

    def advance_to(self, t: float) -> None:
        """Let idle virtual time pass (the clock never runs backwards)."""
        self.now = max(self.now, t)
        self.is_crashed()

    def gen_throughput(self) -> float:
        """Output tokens per virtual second over the last few seconds of decode steps."""
        while self._recent_decode and self._recent_decode[0][0] < self.now - THROUGHPUT_WINDOW_S:
            self._recent_decode.popleft()
        return sum(n for _, n in self._recent_decode) / THROUGHPUT_WINDOW_S

    def num_retracted_waiting(self) -> int:
        return sum(1 for r in self.waiting if r.retractions)

    # -- one forward pass -----------------------------------------------------------------------------
    def step(self) -> StepResult | None:
        """Run the next forward pass; None when nothing can run now (idle, crashed, or all future)."""
        if self.is_crashed():
            return None
        result = self._prefill()
        if result is None and self.running:
            result = self._decode()
        if result is None and not self.running and self.chunked is None:
            self.new_token_ratio = self.init_new_token_ratio  # SGLang re-inits state when idle
        return result

    def _ordered_waiting(self) -> list[SimRequest]:
        ready = [r for r in self.waiting if r.arrival <= self.now]
        if self.config.schedule_policy == "priority":
            ready.sort(key=lambda r: (-r.priority, r.queue_seq))
        return ready

    def _prefill(self) -> StepResult | None:
        ready = self._ordered_waiting()
        if not ready and self.chunked is None:
            return None
        allocatable = self.config.max_running_requests - len(self.running)
        if allocatable <= 0 and self.chunked is None:
            return None
        budget = _PrefillBudget(
            available=self.free_tokens,
            reserved=sum(r.remaining_budget * self.new_token_ratio for r in self.running),
            max_prefill=self.config.max_prefill_tokens,
            chunk=self.config.chunked_prefill_size if self.config.chunked_prefill_size > 0 else None,
        )
        batch: list[tuple[SimRequest, int]] = []
        new_chunked: SimRequest | None = None
        if self.chunked is not None:
            req = self.chunked
            take = min(req.fill_len - req.kv, budget.chunk_left, int(budget.rem_total))
            if take <= 0:
                return None
            truncated = take < req.fill_len - req.kv
            batch.append((req, take))
            budget.take(take, 0 if truncated else req.remaining_budget)
            new_chunked = req if truncated else None
        for req in ready:
            if len(batch) >= allocatable or not budget.can_continue():
                break
            ext = req.fill_len
            if ext + req.remaining_budget >= budget.rem_total:
                break  # NO_TOKEN: the KV reservation refuses admission
            if ext >= budget.rem_input and batch:
                break
            if budget.chunk is None or ext <= budget.chunk_left:
                batch.append((req, ext))
                budget.take(ext, req.remaining_budget)
            else:
                if budget.chunk_left <= 0:
                    break
                batch.append((req, budget.chunk_left))
                budget.take(budget.chunk_left, 0)
                new_chunked = req
        if not batch:
            return None
        return self._run_prefill(batch, new_chunked)

    def _run_prefill(self, batch: list[tuple[SimRequest, int]], new_chunked: SimRequest | None) -> StepResult:
        start = self.now
        chunks = [PrefillChunk(req.kv, take, req.encoder_tokens if req.kv == 0 else 0) for req, take in batch]
        self.now += self.costs.prefill_time(chunks)
        result = StepResult("prefill", start, self.now, prefill_tokens=sum(take for _, take in batch))
        for req, take in batch:
            if req is not self.chunked:
                self.waiting.remove(req)
                if req.admitted_at is None:
                    req.admitted_at = start
            req.kv += take
            self.used_tokens += take
            if req is new_chunked:
                continue
            req.generated += 1  # the forward pass over the last prompt token samples the next token
            req.token_times.append(self.now)
            result.emitted.append(req)
            if req.done:
                self._complete(req, result)
            else:
                self.running.append(req)
        self.chunked = new_chunked
        return result

    def _decode(self) -> StepResult:
        start = self.now
        retracted: list[SimRequest] = []
        if self.free_tokens < len(self.running):
            if self.config.oom_mode == "crash":
                return self._crash()
            retracted = self._retract()
        else:
            self.new_token_ratio = max(
                self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio
            )
        batch = self.running
        self.now += self.costs.decode_time(len(batch), sum(r.kv for r in batch))
        result = StepResult("decode", start, self.now, retracted=retracted)
        for req in list(batch):
            req.kv += 1
            self.used_tokens += 1
            req.generated += 1
            req.token_times.append(self.now)
            result.emitted.append(req)
            if req.done:
                self.running.remove(req)
                self._complete(req, result)
        self._recent_decode.append((self.now, len(result.emitted)))
        return result

    def _retract(self) -> list[SimRequest]:
        """SGLang's retract_decode: drop the least-advanced requests until one decode step fits."""
        order = sorted(self.running, key=lambda r: (r.generated, -r.prompt_tokens), reverse=True)
        retracted: list[SimRequest] = []
        while not retracted or self.free_tokens < len(order):
            if len(order) == 1:
                break  # SGLang keeps the last request running rather than retract it
            req = order.pop()
            self.running.remove(req)
            self.used_tokens -= req.kv
            req.kv = 0
            req.retractions += 1
            retracted.append(req)
            self._enqueue(req)
        decoded = sum(r.generated for r in self.running)
        budget = sum(r.max_new_tokens for r in self.running)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / (budget + 1))
        self.total_retracted += len(retracted)
        return retracted

    def _crash(self) -> StepResult:
        """`oom_mode: crash`: the process dies; everything in it fails and it refuses work for a while."""
        result = StepResult("crash", self.now, self.now)
        victims = [*self.running, *self.waiting, *([self.chunked] if self.chunked else [])]
        self.running, self.waiting, self.chunked = [], [], None
        self.used_tokens = 0
        for req in victims:
            req.kv = 0
            req.error = EngineError(500, CRASH_MESSAGE)
            req.finish_reason = "error"
            req.finished_at = self.now
            result.failed.append(req)
        self.total_crashes += 1
        self.crashed_until = self.now + self.config.restart_s
        self.new_token_ratio = self.init_new_token_ratio
        return result

    # -- helpers ---------------------------------------------------------------------------------------
    def _enqueue(self, req: SimRequest) -> None:
        req.queue_seq = next(self._seq)
        self.waiting.append(req)

    def _complete(self, req: SimRequest, result: StepResult) -> None:
        self.used_tokens -= req.kv
        req.kv = 0
        req.finished_at = self.now
        req.finish_reason = "length" if req.generated >= req.max_new_tokens else "stop"
        result.finished.append(req)

    def _finish_aborted(self, req: SimRequest) -> SimRequest:
        self.used_tokens -= req.kv
        req.kv = 0
        req.finished_at = self.now
        req.finish_reason = "abort"
        self.total_aborted += 1
        return req


class _PrefillBudget:
    """SGLang's PrefillAdder budgets for one scheduling round, in tokens."""

    def __init__(self, available: int, reserved: float, max_prefill: int, chunk: int | None) -> None:
        self.available = available
        self.total_offset = reserved
        self.cur_offset = 0
        self.rem_input = max_prefill
        self.chunk = chunk
        self.chunk_left = chunk if chunk is not None else 1 << 62

    @property
    def rem_total(self) -> float:
        return self.available - self.total_offset

    def take(self, extend: int, output_budget: int) -> None:
        self.total_offset += extend + output_budget
        self.cur_offset += extend
        self.rem_input -= extend
        self.chunk_left -= extend

    def can_continue(self) -> bool:
        return (
            self.rem_total > 0
            and self.available - self.cur_offset > 0
            and self.rem_input > 0
            and self.chunk_left > 0
        )
