"""Workload files: what to send (content mix, lengths, media, tenants) and when (arrival spec).

A workload is a YAML file validated by pydantic; CLI flags override single fields. The factory turns
a seeded RNG into OpenAI chat-completion requests, so the same seed yields the same request sequence.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from gateway.settings.schema import Frozen, describe
from loadtest.arrivals import Process, Shape, burst_shape, constant_shape, sawtooth_shape, step_shape
from loadtest.client import SPEECH_PATH, PreparedRequest
from loadtest.media import MediaCache

BUCKETS = ("text", "single_image", "multi_image", "long_doc", "long_answer", "audio", "audio_out", "speech")
"""`audio_out`: a text chat answered in text and speech (`modalities`); `speech`: /v1/audio/speech, its
`input` a prompt-length text."""


class Dist(Frozen):
    """An integer length distribution, clamped to [min, max]. lognormal is given by its median."""

    dist: Literal["fixed", "uniform", "normal", "lognormal"] = "fixed"
    value: int = 128
    mean: float = 128.0
    median: float = 128.0
    sigma: float = 0.0
    min: int = 1
    max: int = 1_000_000

    def sample(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            x = float(self.value)
        elif self.dist == "uniform":
            x = rng.uniform(self.min, self.max)
        elif self.dist == "normal":
            x = rng.gauss(self.mean, self.sigma)
        else:
            x = rng.lognormvariate(math.log(self.median), self.sigma)
        return max(self.min, min(self.max, round(x)))


class ImageSpec(Frozen):
    resolutions: list[tuple[int, int]] = Field(default_factory=lambda: [(1024, 768)], min_length=1)
    count: tuple[int, int] = (1, 1)
    format: Literal["png", "jpeg"] = "png"
    variants: int = Field(default=16, ge=1)


class AudioSpec(Frozen):
    seconds: tuple[float, float] = (5.0, 20.0)
    variants: int = Field(default=4, ge=1)


class BucketSpec(Frozen):
    """Per-bucket request shape: its own output budget and body fields (e.g. `ignore_eos: true`, so a
    long-form answer runs to max_tokens, as document summaries and reports do), and runs of it sent back
    to back (a batch job). Request numbers count per worker, so with `--workers N` each worker sends it."""

    output_tokens: Dist | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)
    run: int = Field(
        default=1, ge=1, description="Requests sent back to back once picked (a batch job's documents)."
    )
    at: int | None = Field(
        default=None, ge=0, description="Start a run at this request number (warm-up included), not by mix."
    )
    every: int | None = Field(
        default=None, ge=1, description="With `at`: start another run every N requests."
    )

    @model_validator(mode="after")
    def _check(self) -> BucketSpec:
        if self.every is not None and self.at is None:
            raise ValueError("every needs at (the request number of the first run)")
        return self


class Share(Frozen):
    name: str
    share: float = Field(default=1.0, ge=0)


class TenantShare(Share):
    """`name` is the API key sent; reports name the tenant by `id`, else by the key's fingerprint."""

    id: str | None = Field(default=None, description="The tenant's id, as reports name it.")

    @property
    def label(self) -> str:
        return self.id or key_fingerprint(self.name)


def key_fingerprint(key: str) -> str:
    """How a report names a key it was given no tenant id for: never the key itself."""
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:8]


class PriorityShare(Frozen):
    value: int
    share: float = Field(default=1.0, ge=0)


class Arrivals(Frozen):
    shape: Literal["constant", "step", "sawtooth", "burst"] = "constant"
    process: Process = "poisson"
    burstiness: float = Field(default=1.0, gt=0)
    rate: float = Field(default=10.0, ge=0)
    rates: list[float] = Field(default_factory=list)
    dwell: float = Field(default=30.0, gt=0)
    low: float = Field(default=10.0, ge=0)
    high: float = Field(default=80.0, ge=0)
    period: float = Field(default=60.0, gt=0)
    base: float = Field(default=5.0, ge=0)
    peak: float = Field(default=50.0, ge=0)
    every: float = Field(default=30.0, gt=0)
    length: float = Field(default=3.0, gt=0)
    concurrency: int | None = Field(
        default=None, ge=1, description="Closed loop: this many in flight, no schedule."
    )

    def build(self, duration: float) -> Shape:
        if self.shape == "constant":
            return constant_shape(self.rate)
        if self.shape == "step":
            return step_shape(self.rates or [self.rate], self.dwell)
        if self.shape == "sawtooth":
            return sawtooth_shape(self.low, self.high, self.period, duration)
        return burst_shape(self.base, self.peak, self.every, self.length, duration)


class Warmup(Frozen):
    duration: float = Field(default=5.0, ge=0)
    rate: float = Field(default=2.0, gt=0)
    count: int | None = Field(default=None, ge=0)


class Slo(Frozen):
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    ttfa_ms: float | None = Field(default=None, description="Time to first audio, for answers that speak.")
    rtf: float | None = Field(
        default=None, description="Highest real-time factor of a speaking stream (1: as fast as playback)."
    )


class Workload(Frozen):
    name: str = "custom"
    model: str = "default"
    seed: int = 0
    mix: dict[str, float] = Field(
        default_factory=lambda: {"text": 5.0, "single_image": 3.0, "multi_image": 2.0}
    )
    prompt_tokens: Dist = Field(default_factory=lambda: Dist(dist="lognormal", median=256, sigma=0.6))
    long_doc_tokens: Dist = Field(default_factory=lambda: Dist(dist="uniform", min=6000, max=12000))
    output_tokens: Dist = Field(default_factory=lambda: Dist(dist="lognormal", median=200, sigma=0.5))
    images: dict[str, ImageSpec] = Field(
        default_factory=lambda: {
            "single_image": ImageSpec(resolutions=[(1024, 768), (1280, 720), (640, 480)]),
            "multi_image": ImageSpec(resolutions=[(1024, 768), (800, 600)], count=(2, 4), format="jpeg"),
        }
    )
    audio: AudioSpec = AudioSpec()
    api_key: str | None = Field(default=None, description="Bearer key sent when no tenants are listed.")
    tenants: list[TenantShare] = Field(
        default_factory=list, description="Tenants by API key (and id, for reports), with traffic shares."
    )
    priorities: list[PriorityShare] = Field(default_factory=list)
    classes: list[Share] = Field(default_factory=list)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    voice: str = Field(default="default", description="The voice of audio_out and speech requests.")
    stream: bool = Field(
        default=True,
        description="Stream the answers (TTFT, ITL) or ask for whole ones, as batch clients do (TTFT = E2E).",
    )
    buckets: dict[str, BucketSpec] = Field(
        default_factory=dict, description="Per-bucket max_tokens and body fields over the defaults."
    )
    arrivals: Arrivals = Arrivals()
    duration: float = Field(default=60.0, gt=0)
    count: int | None = Field(default=None, ge=1)
    warmup: Warmup = Warmup()
    slo: Slo = Slo()
    time_scale: float = Field(
        default=1.0, gt=0, description="Simulator speed-up: schedule compressed, times expanded."
    )
    trace: str | None = None
    trace_speed: float = Field(default=1.0, gt=0)
    timeout: float = Field(default=600.0, gt=0)
    drain: float | None = Field(
        default=None,
        gt=0,
        description="Seconds to wait for requests in flight after the last send; the rest are unfinished.",
    )

    @model_validator(mode="after")
    def _check(self) -> Workload:
        for field_name, names in (("mix", self.mix), ("buckets", self.buckets)):
            unknown = set(names) - set(BUCKETS)
            if unknown:
                raise ValueError(
                    f"unknown buckets in {field_name}: {sorted(unknown)}; known: {list(BUCKETS)}"
                )
        if not any(v > 0 for v in self.mix.values()):
            raise ValueError("mix needs at least one positive share")
        for b in ("single_image", "multi_image"):
            if self.uses(b) and b not in self.images:
                raise ValueError(f"the workload sends {b} but images.{b} is not configured")
        return self

    def uses(self, bucket: str) -> bool:
        """Whether any request can be of this bucket: a mix share or a scheduled run."""
        spec = self.buckets.get(bucket)
        return self.mix.get(bucket, 0) > 0 or (spec is not None and spec.at is not None)


class WorkloadError(ValueError):
    """A workload file or override that cannot be used; the message says which field and why."""


def load_workload(path: str | Path | None, overrides: dict[str, Any] | None = None) -> Workload:
    """Load a YAML workload (or defaults) and apply dotted-key overrides like {"arrivals.rate": 20}."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as e:
            raise WorkloadError(f"{path}: {e}") from None
        if not isinstance(loaded, dict):
            raise WorkloadError(f"{path}: top level must be a mapping")
        data = loaded
    for key, value in (overrides or {}).items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    try:
        return Workload.model_validate(data)
    except ValidationError as e:
        raise WorkloadError(f"{path or '<workload>'}: {describe(e)}") from None


_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "from",
    "at",
    "or",
    "an",
    "have",
    "not",
    "which",
    "but",
    "model",
    "image",
    "token",
    "batch",
    "queue",
    "request",
    "latency",
    "memory",
    "cache",
    "decode",
    "prefill",
    "scheduler",
    "tenant",
    "gateway",
]


def _pick(rng: random.Random, names: list[Any], weights: list[float]) -> Any:
    return rng.choices(names, weights=weights, k=1)[0]


class RequestFactory:
    """Seeded request generator for one worker; call `next()` once per send in schedule order."""

    def __init__(self, workload: Workload, media: MediaCache, worker: int = 0) -> None:
        self.w = workload
        self.media = media
        self.rng = random.Random(f"omnigate-content:{workload.seed}:{worker}")
        self._buckets = [b for b, s in workload.mix.items() if s > 0]
        self._bucket_w = [workload.mix[b] for b in self._buckets]
        self._run: tuple[str, int] = ("", 0)  # bucket of the run in progress, requests left in it
        self._sent = 0

    def text(self, n_tokens: int) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(n_tokens))

    def _parts(self, bucket: str) -> list[dict[str, Any]]:
        rng, w = self.rng, self.w
        n_text = (w.long_doc_tokens if bucket == "long_doc" else w.prompt_tokens).sample(rng)
        parts: list[dict[str, Any]] = [{"type": "text", "text": self.text(n_text)}]
        if bucket in ("single_image", "multi_image"):
            spec = w.images[bucket]
            for _ in range(rng.randint(*spec.count)):
                width, height = rng.choice(spec.resolutions)
                uri = self.media.image_uri(width, height, rng.randrange(spec.variants), spec.format)
                parts.append({"type": "image_url", "image_url": {"url": uri}})
        elif bucket == "audio":
            seconds = float(round(rng.uniform(*w.audio.seconds)))
            data = self.media.audio_b64(seconds, rng.randrange(w.audio.variants))
            parts.append({"type": "input_audio", "input_audio": {"data": data, "format": "wav"}})
        return parts

    def prewarm(self) -> None:
        """Render every image and clip the workload can pick, so no send waits on Pillow."""
        w = self.w
        for bucket, spec in w.images.items():
            if w.uses(bucket):
                for (width, height), v in itertools.product(spec.resolutions, range(spec.variants)):
                    self.media.image_uri(width, height, v, spec.format)
        if w.uses("audio"):
            lo, hi = round(w.audio.seconds[0]), round(w.audio.seconds[1])
            for sec, v in itertools.product(range(lo, hi + 1), range(w.audio.variants)):
                self.media.audio_b64(float(sec), v)

    def _next_bucket(self) -> str:
        bucket, left = self._run
        n, self._sent = self._sent, self._sent + 1
        for name, sched in self.w.buckets.items():
            if sched.at is not None and n >= sched.at and (n - sched.at) % (sched.every or n + 1) == 0:
                bucket, left = name, sched.run
        if left <= 0:
            bucket = _pick(self.rng, self._buckets, self._bucket_w)
            picked = self.w.buckets.get(bucket)
            left = picked.run if picked is not None else 1
        self._run = (bucket, left - 1)
        return bucket

    def next(self) -> PreparedRequest:
        rng, w = self.rng, self.w
        bucket = self._next_bucket()
        spec = w.buckets.get(bucket)
        output = (
            spec.output_tokens if spec is not None and spec.output_tokens is not None else w.output_tokens
        )
        body: dict[str, Any] = {
            "model": w.model,
            "messages": [{"role": "user", "content": self._parts(bucket)}],
            "max_tokens": output.sample(rng),
            "stream": w.stream,
            **({"stream_options": {"include_usage": True}} if w.stream else {}),
            **(
                {"modalities": ["text", "audio"], "audio": {"voice": w.voice}}
                if bucket == "audio_out"
                else {}
            ),
            **w.extra_body,
            **(spec.extra_body if spec is not None else {}),
        }
        path = None
        if bucket == "speech":
            text = self.text(w.prompt_tokens.sample(rng))
            body = {"model": w.model, "input": text, "voice": w.voice, "stream": w.stream}
            if (
                w.stream
            ):  # the only streamed form sglang-omni 0.1.9 takes (raw PCM); the snapshot reads it too
                body["response_format"] = "pcm"
            body.update(spec.extra_body if spec is not None else {})
            path = SPEECH_PATH
        headers: dict[str, str] = {}
        req = PreparedRequest(body=body, headers=headers, bucket=bucket)
        if path is not None:
            req.path = path
        if w.tenants:
            tenant = _pick(rng, w.tenants, [t.share for t in w.tenants])
            req.tenant = tenant.label
            headers["authorization"] = f"Bearer {tenant.name}"
        elif w.api_key:
            headers["authorization"] = f"Bearer {w.api_key}"
        if w.priorities:
            req.priority = _pick(rng, [p.value for p in w.priorities], [p.share for p in w.priorities])
            headers["x-priority"] = str(req.priority)
        if w.classes:
            req.traffic_class = _pick(rng, [c.name for c in w.classes], [c.share for c in w.classes])
            headers["x-omnigate-class"] = req.traffic_class
        return req
