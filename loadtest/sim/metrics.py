"""SGLang's Prometheus metrics, on a registry of this app's own (several sims may share a process).

Gauges are refreshed from the engine at scrape time; histograms are fed per step, in virtual seconds, so a
scraper sees the same numbers a real engine with that schedule would report. The prompt and generation
token counters grow when a request ends, by its whole prompt (once its prefill started) and every token it
generated, as SGLang 0.5.23 counts them; per step (recomputations included) with `legacy` (0.5.9).

SGLang 0.5.23's gauges (the default; 0.5.9's with `legacy`) carry `moe_ep_rank` and `priority` labels: the
whole scheduler is `priority=""`, and with priority scheduling the request gauges add one series per
priority seen since start (a request without one is `priority="-9223372036854775808"`); the KV pool is also
split into `kv_used_tokens`, `kv_available_tokens` and `kv_evictable_tokens` (the radix cache's unlocked
tokens with `--radix-cache`, else 0).
"""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from loadtest.sim.engine import Engine, SimRequest, StepResult

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.0,
)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800)
# Fine below a second, where the seed's queue P99s live (18–390 ms); interpolation inside a
# 0.1–0.5 s bucket would otherwise blur exactly the values a sweep compares.
QUEUE_BUCKETS = (
    0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1, 2, 5, 10, 20, 50, 100, 200, 500,
)  # fmt: skip


NO_PRIORITY = str(-(1 << 63))  # SGLang 0.5.23's label for a request sent without a priority
MEMORY_PEAK = "sim:memory_peak_bytes"
REQUESTS_PEAK = "sim:requests_peak"


class SimMetrics:
    """`memory_window_s`: the virtual span the memory-peak gauge looks back over (one wall second at the
    app's time scale, so a scraper polling twice a second sees every step's peak)."""

    def __init__(
        self,
        model_name: str,
        memory_window_s: float = 1.0,
        legacy: bool = False,
        priority_scheduling: bool = False,
    ) -> None:
        self.memory_window_s = memory_window_s
        self.registry = CollectorRegistry()
        sched = {"model_name": model_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
        if not legacy:
            sched.update(moe_ep_rank="0", priority="")
        self.legacy = legacy
        self.priority_scheduling = priority_scheduling
        self._priorities: set[str] = set()  # every priority label a request gauge has shown
        self._sched = sched
        self._tok = {"model_name": model_name}
        r, s, t = self.registry, list(sched), ["model_name"]

        def g(name: str, doc: str) -> Gauge:
            return Gauge(f"sglang:{name}", doc, s, registry=r)

        self.num_running_reqs = g("num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = g("num_queue_reqs", "The number of requests in the waiting queue.")
        self.num_used_tokens = g("num_used_tokens", "The number of used tokens.")
        self.token_usage = g("token_usage", "The token usage.")
        self.max_total_num_tokens = g(
            "max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."
        )
        self.gen_throughput = g("gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = g("cache_hit_rate", "The prefix cache hit rate.")
        self.num_retracted_reqs = g("num_retracted_reqs", "The number of retracted requests.")
        self.kv = {
            part: g(f"kv_{part}_tokens", f"KV cache tokens: {part}.")
            for part in ("used", "available", "evictable")
        }
        self.memory_peak = Gauge(
            MEMORY_PEAK,
            "Simulator only (SGLang exports no such gauge): peak GPU memory in use over the last wall "
            "second: context, weights, CUDA graphs, KV cells holding tokens, the step's activations.",
            s,
            registry=r,
        )
        self.requests_peak = Gauge(
            REQUESTS_PEAK,
            "Simulator only: the most requests the engine held at once (waiting or running) since start, "
            "counted at each arrival: what all the clients together asked of it.",
            s,
            registry=r,
        )
        self.retracted_total = Counter(
            "sglang:num_retracted_requests", "Total number of retracted requests.", s, registry=r
        )
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", t, registry=r
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", t, registry=r
        )
        self.requests = Counter("sglang:num_requests", "Number of requests processed.", t, registry=r)
        self.aborted = Counter("sglang:num_aborted_requests", "Number of requests aborted.", t, registry=r)
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            t,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            t,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            t,
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "sglang:queue_time_seconds",
            "Histogram of queueing time in seconds.",
            t,
            buckets=QUEUE_BUCKETS,
            registry=r,
        )

    def on_step(self, result: StepResult) -> None:
        tok = self._tok
        for req in result.emitted:
            if len(req.token_times) == 1:
                self.ttft.labels(**tok).observe(req.token_times[0] - req.arrival)
                if req.admitted_at is not None:
                    self.queue_time.labels(**tok).observe(req.admitted_at - req.arrival)
            elif len(req.token_times) >= 2:
                self.itl.labels(**tok).observe(req.token_times[-1] - req.token_times[-2])
        if self.legacy:  # 0.5.23 counts a request's tokens when it ends (on_finished)
            self.generation_tokens.labels(**tok).inc(len(result.emitted))
            self.prompt_tokens.labels(**tok).inc(result.prefill_tokens)
        if result.retracted:
            self.retracted_total.labels(**self._sched).inc(len(result.retracted))
        for req in result.finished:
            self.on_finished(req)
        for req in result.failed:
            if req.finish_reason == "abort":  # dropped from a full queue, not failed by the engine
                self.on_aborted(req)
            else:
                self.on_finished(req)

    def on_finished(self, req: SimRequest) -> None:
        tok = self._tok
        self.requests.labels(**tok).inc()
        if not self.legacy:
            if req.admitted_at is not None:
                self.prompt_tokens.labels(**tok).inc(req.prompt_tokens)
            self.generation_tokens.labels(**tok).inc(req.generated)
        if req.finished_at is not None:
            self.e2e.labels(**tok).observe(req.finished_at - req.arrival)

    def on_aborted(self, req: SimRequest) -> None:
        self.aborted.labels(**self._tok).inc()
        self.on_finished(req)

    def on_left(self, req: SimRequest) -> None:
        """Its client aborted it. One that leaves the queue before its prefill is, in 0.5.23, an abort
        but not a request, and no tokens (measured: tests/engine/test_contract.py)."""
        if req.admitted_at is None and not self.legacy:
            self.aborted.labels(**self._tok).inc()
        else:
            self.on_aborted(req)

    def render(self, engine: Engine, peak_requests: int = 0) -> bytes:
        s = self._sched
        self.requests_peak.labels(**s).set(peak_requests)
        total = engine.config.max_total_tokens
        self.num_running_reqs.labels(**s).set(engine.num_running)
        self.num_queue_reqs.labels(**s).set(len(engine.waiting))
        self.num_used_tokens.labels(**s).set(engine.used_tokens)
        self.token_usage.labels(**s).set(round(engine.used_tokens / total, 4))
        self.max_total_num_tokens.labels(**s).set(total)
        self.gen_throughput.labels(**s).set(round(engine.gen_throughput(), 2))
        self.cache_hit_rate.labels(**s).set(round(engine.cache.hit_rate, 4) if engine.cache else 0.0)
        self.num_retracted_reqs.labels(**s).set(engine.num_retracted_waiting())
        if not self.legacy:
            evictable = engine.evictable_tokens
            free = total - engine.used_tokens - evictable
            parts = (("used", engine.used_tokens), ("available", free), ("evictable", evictable))
            for part, amount in parts:
                self.kv[part].labels(**s).set(amount)
            if self.priority_scheduling:
                self._by_priority(engine)
        self.memory_peak.labels(**s).set(engine.memory_peak(self.memory_window_s))
        return generate_latest(self.registry)

    def _by_priority(self, engine: Engine) -> None:
        running = [*engine.running, *([engine.chunked] if engine.chunked is not None else [])]
        counts = {
            self.num_running_reqs: Tally(_priority(r) for r in running),
            self.num_queue_reqs: Tally(_priority(r) for r in engine.waiting),
        }
        for tally in counts.values():
            self._priorities.update(tally)
        for gauge, tally in counts.items():
            for priority in self._priorities:
                gauge.labels(**{**self._sched, "priority": priority}).set(tally.get(priority, 0))


def _priority(req: SimRequest) -> str:
    return NO_PRIORITY if req.priority is None else str(req.priority)
