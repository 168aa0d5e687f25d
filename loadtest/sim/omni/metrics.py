"""sglang-omni's opt-in Prometheus text (`--enable-metrics`, `serve/metrics.py`, PR #948): the coordinator's
/health snapshot as `sglang_omni_*` gauges plus HTTP request counters and handler durations; and, as newer
servers export them (`metrics/audio.py`), the audio histograms of the later release's PCM speech streams
(`sglang_omni:audio_ttfp_s`, `audio_rtf` = engine time ÷ audio seconds, `audio_duration_s`; sums and
counts, one +Inf bucket).

Rendered in that module's own format (sorted labels, "1.0"-style values), not by prometheus_client. Handler
durations are virtual seconds, like every time the simulator reports; the simulator's private routes
(`/sim/…`, `/admin/…`) are not counted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PROMETHEUS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PRIVATE_PREFIXES = ("/sim/", "/admin/")
GAUGES = (
    ("sglang_omni_pipeline_running", "Whether the Omni coordinator reports the pipeline as running."),
    (
        "sglang_omni_pipeline_tracked_requests",
        "Number of currently tracked requests according to the Omni coordinator health snapshot.",
    ),
    (
        "sglang_omni_pipeline_pending_completions",
        "Number of pending completions reported by the Omni coordinator.",
    ),
    ("sglang_omni_request_states", "Number of Omni requests by coordinator state."),
    ("sglang_omni_stage_present", "Whether a stage is present in the Omni coordinator health snapshot."),
)
REQUESTS = (
    "sglang_omni_http_requests_total",
    "Total number of HTTP requests handled by the Omni API server.",
)
DURATION = (
    "sglang_omni_http_request_duration_seconds",
    "HTTP handler duration in seconds for the Omni API server. For streaming responses, this does not "
    "represent full end-to-end stream duration.",
)

AUDIO = ("sglang_omni:audio_ttfp_s", "sglang_omni:audio_rtf", "sglang_omni:audio_duration_s")
Labels = tuple[tuple[str, str], ...]


def _value(v: float) -> str:
    if v == 0:
        return "0.0"
    return f"{v:.1f}" if float(v).is_integer() else f"{v:.17g}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample(name: str, labels: Mapping[str, str], value: float) -> str:
    rendered = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items()))
    return f"{name}{{{rendered}}} {_value(value)}" if rendered else f"{name} {_value(value)}"


class OmniMetrics:
    def __init__(self, model_name: str) -> None:
        self.model = model_name
        self.gauges: dict[tuple[str, Labels], float] = {}
        self.known_states: set[str] = set()
        self.known_stages: set[str] = set()
        self.requests: defaultdict[tuple[str, str, str], float] = defaultdict(float)
        self.count: defaultdict[tuple[str, str], float] = defaultdict(float)
        self.total: defaultdict[tuple[str, str], float] = defaultdict(float)
        self.buckets: defaultdict[tuple[str, str, float], float] = defaultdict(float)
        # histogram → [sum, count]; exported from the start, as prometheus_client's unlabelled histograms are
        self.audio: dict[str, list[float]] = {name: [0.0, 0.0] for name in AUDIO}

    def observe_audio(self, ttfp_s: float, engine_s: float, audio_s: float) -> None:
        """One finished speech stream, in the server's terms (virtual seconds)."""
        ttfp, rtf, duration = AUDIO
        observed = {ttfp: ttfp_s, duration: audio_s}
        if audio_s > 0:
            observed[rtf] = engine_s / audio_s
        for name, value in observed.items():
            total = self.audio[name]
            total[0] += value
            total[1] += 1

    def _set(self, name: str, value: float, **extra: str) -> None:
        labels = {"model_name": self.model, **extra}
        self.gauges[(name, tuple(sorted(labels.items())))] = float(value)

    def update_from_health(self, info: Mapping[str, Any]) -> None:
        self._set("sglang_omni_pipeline_running", 1.0 if info.get("running") else 0.0)
        self._set("sglang_omni_pipeline_pending_completions", float(info.get("pending_completions") or 0))
        for state in self.known_states:
            self._set("sglang_omni_request_states", 0.0, state=state)
        tracked = 0.0
        for state, count in (info.get("request_states") or {}).items():
            tracked += count
            self.known_states.add(str(state))
            self._set("sglang_omni_request_states", count, state=str(state))
        self._set("sglang_omni_pipeline_tracked_requests", tracked)
        for stage in self.known_stages:
            self._set("sglang_omni_stage_present", 0.0, stage=stage)
        for stage in info.get("stages") or []:
            self.known_stages.add(str(stage))
            self._set("sglang_omni_stage_present", 1.0, stage=str(stage))

    def observe(self, method: str, route: str, status: str, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requests[(method, route, status)] += 1
        self.count[(method, route)] += 1
        self.total[(method, route)] += seconds
        for bucket in DURATION_BUCKETS:
            if seconds <= bucket:
                self.buckets[(method, route, bucket)] += 1

    def render(self) -> bytes:
        lines: list[str] = []
        for name, doc in GAUGES:
            lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
            samples = sorted((labels, v) for (n, labels), v in self.gauges.items() if n == name)
            lines += [_sample(name, dict(labels), v) for labels, v in samples]
        name, doc = REQUESTS
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} counter"]
        for method, route, status in sorted(self.requests):
            labels = {"method": method, "model_name": self.model, "route": route, "status": status}
            lines.append(_sample(name, labels, self.requests[(method, route, status)]))
        name, doc = DURATION
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
        for method, route in sorted(self.count):
            base = {"method": method, "model_name": self.model, "route": route}
            for bucket in DURATION_BUCKETS:
                count = self.buckets[(method, route, bucket)]
                lines.append(_sample(f"{name}_bucket", {**base, "le": f"{bucket:g}"}, count))
            lines.append(_sample(f"{name}_bucket", {**base, "le": "+Inf"}, self.count[(method, route)]))
            lines.append(_sample(f"{name}_count", base, self.count[(method, route)]))
            lines.append(_sample(f"{name}_sum", base, self.total[(method, route)]))
        for name, (total, count) in sorted(self.audio.items()):
            lines += [f"# TYPE {name} histogram", _sample(f"{name}_bucket", {"le": "+Inf"}, count)]
            lines += [_sample(f"{name}_count", {}, count), _sample(f"{name}_sum", {}, total)]
        return ("\n".join(lines) + "\n").encode("utf-8")


class HttpMetricsMiddleware:
    """Counts every request but /metrics and the simulator's own routes, by route template and status; the
    duration runs until the response starts (for a stream, until its headers), as the real middleware's."""

    def __init__(
        self, app: ASGIApp, metrics: OmniMetrics, routes: set[str], now: Callable[[], float]
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes
        self.now = now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path == "/metrics" or path.startswith(PRIVATE_PREFIXES):
            await self.app(scope, receive, send)
            return
        start = self.now()
        status = "500"
        elapsed: float | None = None

        async def watch(message: Message) -> None:
            nonlocal status, elapsed
            if message["type"] == "http.response.start":
                status = str(message["status"])
                elapsed = self.now() - start
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            route = path if path in self.routes else "__unmatched__"
            seconds = self.now() - start if elapsed is None else elapsed
            self.metrics.observe(scope["method"], route, status, seconds)
