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

Priority scheduling is SGLang 0.5.9's (`--enable-priority-scheduling`): the waiting queue is ordered by
priority (larger first, or smaller with `schedule_low_priority_values_first`), then entry time; when the
running batch has no free slot, `preempt_to_schedule` evicts running requests whose priority is lower by
more than `priority_scheduling_preemption_threshold` (lowest first, newest first among equals) until the
newcomer's prompt and output budget fit; a full waiting queue (`max_queued_requests`) drops its least
preferred request for a strictly better newcomer.

With a `MemoryModel` the engine also accounts for what the KV pool does not hold (memory.py): a step
whose activations outgrow the headroom crashes the engine (`oom_mode="crash"`, a CUDA out-of-memory
error); with `oom_mode="retract"` a prefill batch stops growing before that, as it stops on KV, and
decode retracts until both KV and activations fit.
"""

from __future__ import annotations

import itertools
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from loadtest.sim.memory import GIB, MemoryModel
from loadtest.sim.profile import CostModel, PrefillChunk
from loadtest.sim.radix_cache import NO_MATCH, Match, Page, RadixCache

CLIP_MAX_NEW_TOKENS = 4096
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
THROUGHPUT_WINDOW_S = 5.0

QUEUE_FULL_MESSAGE = "The request queue is full."
EVICTED_MESSAGE = "The request is aborted by a higher priority request."
CRASH_MESSAGE = "CUDA out of memory while decoding: the scheduler process crashed and is restarting."
DECODE_OOM = "CUDA out of memory in a decode step's activations: the scheduler process crashed and restarts."
RESTARTING_MESSAGE = "The server is restarting after a crash."

# SGLang 0.5.9's --schedule-policy choices. Without a prefix cache the cache-aware ones (lpm, dfs-weight)
# keep first come, first served, as SGLang does with its radix cache off; "priority" is a choice its
# parser accepts and its scheduler refuses at start (priority is --enable-priority-scheduling).
SCHEDULE_POLICY_CHOICES = ("lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key")
MODELLED_POLICIES = ("fcfs", "lof", "lpm", "dfs-weight")


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
    schedule_policy: str = "fcfs"
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    priority_scheduling_preemption_threshold: int = 10
    schedule_conservativeness: float = 1.0
    max_queued_requests: int | None = None
    oom_mode: Literal["retract", "crash"] = "retract"
    restart_s: float = 30.0
    radix_cache: bool = False  # SGLang's prefix cache (radix_cache.py); off: as with --disable-radix-cache

    def __post_init__(self) -> None:
        if self.schedule_policy in ("random", "routing-key"):
            raise ValueError(
                f"schedule_policy {self.schedule_policy!r} is not modelled by the simulator "
                f"(modelled: {', '.join(MODELLED_POLICIES)})"
            )
        if self.schedule_policy not in MODELLED_POLICIES:  # SGLang's scheduler refuses it at start
            raise ValueError(f"Unknown schedule_policy: policy={self.schedule_policy!r}")
        if self.enable_priority_scheduling and self.schedule_policy not in ("fcfs", "lof"):
            raise ValueError(
                "To use priority scheduling, schedule_policy must be 'fcfs' or 'lof'. "
                f"'{self.schedule_policy}' is not supported."
            )

    @property
    def priority_sign(self) -> int:
        """SGLang's sign: sorting by priority × sign puts the preferred requests first."""
        return 1 if self.schedule_low_priority_values_first else -1


@dataclass(eq=False)
class SimRequest:
    """One generation request; the engine owns the fields below `arrival`."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    output_len: int  # tokens it would produce before a natural stop; capped by max_new_tokens
    encoder_tokens: int = 0  # image/audio/video tokens the encoders must produce at (re)prefill
    priority: int | None = None  # None: the least preferred value once priority scheduling is on
    arrival: float = 0.0
    generated: int = 0
    kv: int = 0
    admitted_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_at: float | None = None
    finish_reason: str | None = None  # stop | length | abort | error
    error: EngineError | None = None
    retractions: int = 0
    preemptions: int = 0
    queue_seq: int = 0
    pages: list[Page] = field(default_factory=list)  # the prompt as the radix cache keys it
    match: Match = NO_MATCH  # its cached prefix: locked while it runs, else as last looked up
    locked: bool = False
    cached_tokens: int = 0  # the prefix its (last) admission found cached: its usage's cached_tokens

    @property
    def fill_len(self) -> int:
        """Tokens that must sit in the KV cache before the next token: prompt plus output so far."""
        return self.prompt_tokens + self.generated

    @property
    def to_fill(self) -> int:
        """Tokens still to prefill before its next token: all but its cached prefix and its own KV."""
        return self.fill_len - self.match.tokens - self.kv

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
    preempted: list[SimRequest] = field(default_factory=list)
    prefill_tokens: int = 0
    activation_bytes: int = 0
    kv_tokens: int = 0  # cached tokens while the step runs (before its finished requests free theirs)


class Engine:
    def __init__(
        self, config: EngineConfig, costs: CostModel, start: float = 0.0, memory: MemoryModel | None = None
    ) -> None:
        self.config = config
        self.costs = costs
        self.memory = memory
        self.now = start
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.chunked: SimRequest | None = None
        # tokens running requests hold, their cached prefixes included (SGLang's "used"); the radix cache's
        # unlocked tokens are apart (evictable: free for admission, evicted when the pool needs them)
        self.used_tokens = 0
        self.cache = RadixCache() if config.radix_cache else None
        self.init_new_token_ratio = min(INIT_NEW_TOKEN_RATIO * config.schedule_conservativeness, 1.0)
        self.min_new_token_ratio = min(self.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.new_token_ratio_decay = (
            self.init_new_token_ratio - self.min_new_token_ratio
        ) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_new_token_ratio
        self.crashed_until: float | None = None
        self.total_retracted = 0
        self.total_preempted = 0
        self.total_aborted = 0
        self.total_crashes = 0
        self.memory_in_use = 0 if memory is None else memory.static_bytes
        self._seq = itertools.count()
        self._recent_decode: deque[tuple[float, int]] = deque()
        self._recent_memory: deque[tuple[float, int]] = deque()

    # -- requests in and out ---------------------------------------------------------------------------
    def submit(self, req: SimRequest) -> SimRequest | None:
        """Queue `req`; raises EngineError when refused. Returns the waiting request it evicted, if any
        (a full queue under priority scheduling drops its least preferred request for a better one)."""
        if self.is_crashed():
            raise EngineError(503, RESTARTING_MESSAGE)
        if self.config.enable_priority_scheduling and req.priority is None:
            req.priority = sys.maxsize if self.config.schedule_low_priority_values_first else -sys.maxsize - 1
        evicted = self._make_room(req)
        self._enqueue(req)
        return evicted

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
    def evictable_tokens(self) -> int:
        """Cached tokens no running request holds: free for admission, evicted when the pool needs them."""
        return self.cache.evictable if self.cache is not None else 0

    @property
    def kv_held(self) -> int:
        """Cells that hold tokens: what is used and what the radix cache keeps."""
        return self.used_tokens + self.evictable_tokens

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

    def memory_peak(self, window_s: float) -> int:
        """Largest memory in use over the steps that ended in the last `window_s` virtual seconds."""
        while self._recent_memory and self._recent_memory[0][0] < self.now - window_s:
            self._recent_memory.popleft()
        return max((b for _, b in self._recent_memory), default=self.memory_in_use)

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
        if result is not None and self.memory is not None:
            self.memory_in_use = self.memory.in_use(result.kv_tokens, result.activation_bytes)
            self._recent_memory.append((result.end, self.memory_in_use))
        return result

    def _ordered_waiting(self) -> list[SimRequest]:
        """SchedulePolicy.calc_priority: priority then entry time, or longest output first (lof)."""
        ready = [r for r in self.waiting if r.arrival <= self.now]
        sign = self.config.priority_sign
        by_priority = self.config.enable_priority_scheduling
        if self.config.schedule_policy == "lof":
            ready.sort(key=lambda r: (_rank(r, sign) if by_priority else 0, -r.max_new_tokens))
        elif by_priority:
            ready.sort(key=lambda r: (_rank(r, sign), r.queue_seq))
        return ready

    def _prefill(self) -> StepResult | None:
        ready = self._ordered_waiting()
        if not ready and self.chunked is None:
            return None
        preempting = self.config.enable_priority_scheduling
        if self.config.max_running_requests <= len(self.running) and self.chunked is None and not preempting:
            return None
        budget = _PrefillBudget(
            available=self.free_tokens,
            reserved=sum(self._offset(r) for r in self.running),
            max_prefill=self.config.max_prefill_tokens,
            chunk=self.config.chunked_prefill_size if self.config.chunked_prefill_size > 0 else None,
        )
        batch: list[tuple[SimRequest, int]] = []
        new_chunked: SimRequest | None = None
        preempted: list[SimRequest] = []
        failed: list[SimRequest] = []
        guard = self.memory is not None and self.config.oom_mode == "retract"
        if self.chunked is not None:
            req = self.chunked
            take = min(req.to_fill, budget.chunk_left, int(budget.rem_total))
            if take <= 0:
                return None
            truncated = take < req.to_fill
            if guard and not self._fits([(req, take)]):
                self.chunked = None
                self._fail(req, failed, self._oom_message([(req, take)]))
            else:
                batch.append((req, take))
                budget.take(take, 0 if truncated else req.remaining_budget)
                new_chunked = req if truncated else None
        batch_full = False
        for req in ready:  # Scheduler._get_new_batch_prefill_raw: slots, preemption, then add_one_req
            if len(batch) >= self.config.max_running_requests - len(self.running):
                batch_full = True
            if batch_full and not (preempting and self._preempt_for(req, budget, preempted)):
                break
            self._look_up(req)
            ext = req.to_fill
            if ext + req.remaining_budget >= budget.rem_total:
                break  # NO_TOKEN: the KV reservation refuses admission
            if ext >= budget.rem_input and batch:
                break
            take = ext if budget.chunk is None or ext <= budget.chunk_left else budget.chunk_left
            if take <= 0:
                break
            if guard and not self._fits([*batch, (req, take)]):
                if batch:
                    break  # the batch stops growing before its activations outgrow the headroom
                self.waiting.remove(req)
                self._fail(req, failed, self._oom_message([(req, take)]))
                continue
            batch.append((req, take))
            if take < ext:
                budget.take(take, 0)
                new_chunked = req
                break
            budget.take(ext, req.remaining_budget)
            if not budget.can_continue():  # add_one_req's budget_state() after the request is in
                break
        for req in preempted:  # back to the queue after this round, as SGLang re-adds its preempt_list
            self._requeue(req, failed)
        if not batch:
            if failed or preempted:
                return StepResult(
                    "prefill",
                    self.now,
                    self.now,
                    failed=failed,
                    preempted=preempted,
                    kv_tokens=self.kv_held,
                )
            return None
        if self.memory is not None and not guard and not self._fits(batch):
            return self._crash(self._oom_message(batch))
        result = self._run_prefill(batch, new_chunked)
        result.failed += failed
        result.preempted = preempted
        return result

    def _preempt_for(self, req: SimRequest, budget: _PrefillBudget, preempted: list[SimRequest]) -> bool:
        """PrefillAdder.preempt_to_schedule: free slots and KV for `req` by evicting running requests of
        lower priority (by more than the threshold), least preferred and newest first, just enough."""
        sign = self.config.priority_sign
        order = sorted(self.running, key=lambda r: (-_rank(r, sign), -r.queue_seq))
        need = req.fill_len + min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) - budget.rem_total
        chosen: list[SimRequest] = []
        for r in order:
            if (_rank(r, sign) - _rank(req, sign)) <= self.config.priority_scheduling_preemption_threshold:
                break
            chosen.append(r)
            need -= self._offset(r)
            if need <= 0:
                break
        if not chosen or need > 0:
            return False
        for r in chosen:
            budget.total_offset -= self._offset(r)
            budget.available += r.kv
            self.running.remove(r)
            self._free(r)
            r.preemptions += 1
            preempted.append(r)
        self.total_preempted += len(chosen)
        return True

    def _run_prefill(self, batch: list[tuple[SimRequest, int]], new_chunked: SimRequest | None) -> StepResult:
        start = self.now
        chunks = self._chunks(batch)
        self.now += self.costs.prefill_time(chunks)
        result = StepResult("prefill", start, self.now, prefill_tokens=sum(take for _, take in batch))
        result.activation_bytes = self._activation(batch)
        result.kv_tokens = self.kv_held + result.prefill_tokens
        for req, take in batch:
            if req is not self.chunked:
                self.waiting.remove(req)
                if req.admitted_at is None:
                    req.admitted_at = start
                self._lock(req)
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
        self._reclaim()
        return result

    def _decode(self) -> StepResult:
        start = self.now
        retracted: list[SimRequest] = []
        failed: list[SimRequest] = []
        if not self._decode_fits(len(self.running)):
            if self.config.oom_mode == "crash":
                return self._crash(CRASH_MESSAGE if self.free_tokens < len(self.running) else DECODE_OOM)
            retracted = self._retract(failed)
        else:
            self.new_token_ratio = max(
                self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio
            )
        batch = self.running
        self.now += self.costs.decode_time(len(batch), sum(r.kv + r.match.tokens for r in batch))
        result = StepResult("decode", start, self.now, retracted=retracted, failed=failed)
        result.kv_tokens = self.kv_held + len(batch)
        if self.memory is not None:
            result.activation_bytes = self.memory.decode_bytes(len(batch))
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
        self._reclaim()
        return result

    def _decode_fits(self, batch: int) -> bool:
        """check_decode_mem: one more KV cell per running request, and (with memory) its activations."""
        if self.free_tokens < batch:
            return False
        return self.memory is None or self.memory.decode_bytes(batch) <= self.memory.headroom_bytes

    def _retract(self, failed: list[SimRequest]) -> list[SimRequest]:
        """SGLang's retract_decode: drop the least-advanced requests until one decode step fits."""
        order = sorted(self.running, key=lambda r: (r.generated, -r.prompt_tokens), reverse=True)
        retracted: list[SimRequest] = []
        while not retracted or not self._decode_fits(len(order)):
            if len(order) == 1:
                break  # SGLang keeps the last request running rather than retract it
            req = order.pop()
            self.running.remove(req)
            self._free(req)
            req.retractions += 1
            retracted.append(req)
        for req in retracted:
            self._requeue(req, failed)
        decoded = sum(r.generated for r in self.running)
        budget = sum(r.max_new_tokens for r in self.running)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / (budget + 1))
        self.total_retracted += len(retracted)
        return retracted

    def _crash(self, message: str) -> StepResult:
        """`oom_mode: crash`: the process dies; everything in it fails and it refuses work for a while."""
        result = StepResult("crash", self.now, self.now)
        victims = [*self.running, *self.waiting, *([self.chunked] if self.chunked else [])]
        self.running, self.waiting, self.chunked = [], [], None
        self.used_tokens = 0
        self.cache = RadixCache() if self.config.radix_cache else None
        for req in victims:
            req.kv, req.locked = 0, False
            req.error = EngineError(500, message)
            req.finish_reason = "error"
            req.finished_at = self.now
            result.failed.append(req)
        self.total_crashes += 1
        self.crashed_until = self.now + self.config.restart_s
        self.new_token_ratio = self.init_new_token_ratio
        return result

    # -- helpers ---------------------------------------------------------------------------------------
    def _offset(self, req: SimRequest) -> float:
        """KV a running request keeps reserved for its output: remaining budget × new_token_ratio."""
        return req.remaining_budget * self.new_token_ratio

    def _chunks(self, batch: list[tuple[SimRequest, int]]) -> list[PrefillChunk]:
        """Each request's chunk: what it computes after its cached prefix and its own KV, its encoders run on
        the media after the prefix with its first chunk."""
        out = []
        for req, take in batch:
            encoder = 0 if req.kv else req.encoder_tokens - req.match.encoder
            out.append(PrefillChunk(req.match.tokens + req.kv, take, encoder))
        return out

    def _activation(self, batch: list[tuple[SimRequest, int]]) -> int:
        """Activation bytes of a prefill step over `batch` (before it runs); 0 without a memory model."""
        if self.memory is None:
            return 0
        sampled = sum(take == req.to_fill for req, take in batch)
        return self.memory.prefill_bytes(self._chunks(batch), sampled)

    def _fits(self, batch: list[tuple[SimRequest, int]]) -> bool:
        return self.memory is None or self._activation(batch) <= self.memory.headroom_bytes

    def _oom_message(self, batch: list[tuple[SimRequest, int]]) -> str:
        headroom = 0 if self.memory is None else self.memory.headroom_bytes
        return (
            f"CUDA out of memory. Tried to allocate {self._activation(batch) / GIB:.2f} GiB of prefill "
            f"activations with {headroom / GIB:.2f} GiB outside the KV pool."
        )

    def _make_room(self, req: SimRequest) -> SimRequest | None:
        """Scheduler._abort_on_queued_limit: refuse `req`, or (priority scheduling) evict the least
        preferred waiting request — newest among equals — when `req` is strictly preferred to it."""
        limit = self.config.max_queued_requests
        if limit is None or len(self.waiting) + 1 <= limit:
            return None
        if self.config.enable_priority_scheduling and self.waiting:
            sign = self.config.priority_sign
            worst = max(self.waiting, key=lambda r: (_rank(r, sign), r.queue_seq))
            if _rank(req, sign) < _rank(worst, sign):
                self.waiting.remove(worst)
                worst.error = EngineError(503, EVICTED_MESSAGE)
                return self._finish_aborted(worst)
        raise EngineError(503, QUEUE_FULL_MESSAGE)

    def _requeue(self, req: SimRequest, failed: list[SimRequest]) -> None:
        """Back to the waiting queue (retracted or preempted), through the same queue limit as a newcomer."""
        try:
            evicted = self._make_room(req)
        except EngineError as exc:
            req.error = exc
            failed.append(self._finish_aborted(req))
            return
        if evicted is not None:
            failed.append(evicted)
        self._enqueue(req)

    def _fail(self, req: SimRequest, failed: list[SimRequest], message: str) -> None:
        req.error = EngineError(500, message)
        self._free(req)
        req.finished_at = self.now
        req.finish_reason = "error"
        failed.append(req)

    def _enqueue(self, req: SimRequest) -> None:
        req.queue_seq = next(self._seq)
        self.waiting.append(req)

    def _complete(self, req: SimRequest, result: StepResult) -> None:
        if self.cache is not None:  # its prompt joins the tree: the pages not there already stay in the pool
            self.cache.insert(req.pages)
        self._free(req)
        req.finished_at = self.now
        req.finish_reason = "length" if req.generated >= req.max_new_tokens else "stop"
        result.finished.append(req)

    def _finish_aborted(self, req: SimRequest) -> SimRequest:
        self._free(req)
        req.finished_at = self.now
        req.finish_reason = "abort"
        self.total_aborted += 1
        return req

    # -- the radix cache (radix_cache.py) ------------------------------------------------------------
    def _look_up(self, req: SimRequest) -> None:
        """Before a request's admission: the prefix the tree holds of it (nothing while it holds KV)."""
        if self.cache is not None and not req.kv and not req.locked:
            req.match = self.cache.match(req.pages, req.fill_len)

    def _lock(self, req: SimRequest) -> None:
        """Admitted: its cached prefix is held for it (no longer evictable) and reported in its usage."""
        if self.cache is not None and not req.locked:
            self.used_tokens += self.cache.lock(req.pages, req.match, req.fill_len)
            req.locked, req.cached_tokens = True, req.match.tokens

    def _free(self, req: SimRequest) -> None:
        """The request gives back its own KV and its hold on its cached prefix."""
        self.used_tokens -= req.kv
        req.kv = 0
        if self.cache is not None and req.locked:
            self.used_tokens -= self.cache.unlock(req.pages, req.match)
        req.locked, req.match = False, NO_MATCH

    def _reclaim(self) -> None:
        """Evict unlocked cached pages until what is used and what is cached fit the pool."""
        if self.cache is not None:
            over = self.kv_held - self.config.max_total_tokens
            if over > 0:
                self.cache.evict(over)


def _rank(req: SimRequest, sign: int) -> int:
    """Priority × SGLang's sign: smaller ranks are preferred (set on submit once priorities are on)."""
    return (req.priority or 0) * sign


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
