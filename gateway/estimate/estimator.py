"""The estimate stage's one entry point: price a parsed request, pick its bucket, learn from usage.

    est = Estimator(policy.estimation, policy.buckets)
    cost, bucket = est.estimate(body, endpoint="chat", tenant="acme", urls=pool_policy.media_urls)
    # may raise ApiError(400): bad content, a media URL the pool may not fetch, an oversize prompt
    ...
    est.observe("acme", bucket, usage.completion_tokens)

A request whose answer speaks (a chat with `modalities` holding "audio", or /v1/audio/speech) is priced
its expected audio seconds too (`speech.py`), learned from `est.observe_speech(...)`.

On a policy reload build the next one with `est.reconfigure(new.estimation, new.buckets)`: it keeps the
output and speech learners, so reloads do not forget what was learned.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, Literal

from gateway.estimate.buckets import classify
from gateway.estimate.content import ContentPricer, TextCounter
from gateway.estimate.output import KeyedEwma, OutputEstimator
from gateway.estimate.settings import BucketPolicy, EstimationPolicy, ModelProfile
from gateway.estimate.speech import SpeechRate, voice_of
from gateway.estimate.text import TokenizerCounter, estimate_text_tokens
from gateway.request.errors import ApiError, ErrorCode
from gateway.request.media_urls import MediaUrlPolicy
from gateway.request.ticket import Cost

_FALLBACK_PROFILE = ModelProfile()
_NO_REMOTE_MEDIA = MediaUrlPolicy()
_MAX_CACHED_MODELS = 1024


def _load_counter(policy: EstimationPolicy) -> TextCounter:
    if policy.tokenizer_json is None:
        return estimate_text_tokens
    try:
        return TokenizerCounter(policy.tokenizer_json)
    except Exception as e:  # ImportError, missing file, bad JSON: all mean the policy is unusable
        raise ValueError(f"estimation.tokenizer_json: cannot load {policy.tokenizer_json!r}: {e}") from e


def _cap(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ApiError(
                400, f"{key} must be a non-negative integer", code=ErrorCode.INVALID_VALUE, param=key
            )
        return value
    return None


def _choices(body: dict[str, Any]) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ApiError(400, "n must be a positive integer", code=ErrorCode.INVALID_VALUE, param="n")
    return n


class Estimator:
    def __init__(
        self,
        policy: EstimationPolicy,
        buckets: BucketPolicy,
        *,
        output: OutputEstimator | None = None,
        speech: KeyedEwma | None = None,
    ) -> None:
        self.policy = policy
        self.buckets = buckets
        self._count_text = _load_counter(policy)
        self.output = output or OutputEstimator(
            policy.default_output_tokens,
            alpha=policy.output_ewma_alpha,
            min_samples=policy.output_min_samples,
            max_keys=policy.output_max_keys,
        )
        learned = speech or KeyedEwma(
            policy.output_ewma_alpha, policy.output_min_samples, policy.output_max_keys
        )
        self.speech = SpeechRate(policy.speech_seconds_per_token, learned)
        self._profiles: dict[str, ModelProfile] = {}

    def reconfigure(self, policy: EstimationPolicy, buckets: BucketPolicy) -> Estimator:
        """A new Estimator for a reloaded policy that keeps (and retunes) the learned output statistics."""
        out = self.output
        out.default, out.alpha = policy.default_output_tokens, policy.output_ewma_alpha
        out.min_samples, out.max_keys = policy.output_min_samples, policy.output_max_keys
        spoken = self.speech.learned
        spoken.alpha, spoken.min_samples, spoken.max_keys = out.alpha, out.min_samples, out.max_keys
        return Estimator(policy, buckets, output=out, speech=spoken)

    def count_text(self, text: str) -> int:
        """Tokens of `text` by the policy's text counter: what an answer without usage is charged."""
        return self._count_text(text)

    def profile(self, model: str) -> ModelProfile:
        """The first profile whose glob matches the model name (case-sensitive), else the defaults."""
        found = self._profiles.get(model)
        if found is None:
            found = next((p for p in self.policy.models if fnmatchcase(model, p.match)), _FALLBACK_PROFILE)
            if len(self._profiles) >= _MAX_CACHED_MODELS:
                self._profiles.clear()
            self._profiles[model] = found
        return found

    def estimate(
        self,
        body: dict[str, Any],
        *,
        endpoint: Literal["chat", "completions", "embeddings", "speech"],
        tenant: str,
        urls: MediaUrlPolicy = _NO_REMOTE_MEDIA,
    ) -> tuple[Cost, str]:
        """Price the request and classify it; raises ApiError(400) for bad content, a media URL the pool's
        policy `urls` does not allow (default: no remote media), or an oversize prompt."""
        profile = self.profile(body["model"])
        pricer = ContentPricer(profile, self.policy, self._count_text, urls)
        if endpoint == "embeddings":  # its input is the whole cost: nothing is generated
            cost = pricer.completion(body["input"], "input")
            if isinstance(body["input"], str):  # a list is several sequences, each within the context
                self._check_context(cost, profile)
            return cost, classify(cost, self.buckets)
        voice = voice_of(body, endpoint)
        if endpoint == "speech":
            cost = self._speech(body, profile, pricer, tenant, voice or "")
            return cost, classify(cost, self.buckets, speaks=True)
        if endpoint == "chat":
            cost = pricer.chat(body["messages"], body.get("tools"))
        else:
            cost = pricer.completion(body.get("prompt", ""))
        pricer.media_lists(body, cost)
        self._check_context(cost, profile)
        bucket = classify(cost, self.buckets, speaks=voice is not None)
        n = _choices(body)
        room = profile.context_length - cost.prompt_tokens
        requested = _cap(body)
        cap = max(1, min(profile.default_max_tokens if requested is None else requested, room))
        cost.max_output_tokens = cap * n
        cost.expected_output_tokens = self.output.expected(tenant, bucket, cap * n)
        if voice is not None:
            cost.speech_seconds = self.speech.seconds(tenant, voice, cost.expected_output_tokens)
        return cost, bucket

    def _speech(
        self, body: dict[str, Any], profile: ModelProfile, pricer: ContentPricer, tenant: str, voice: str
    ) -> Cost:
        """/v1/audio/speech: the thinker reads `input` back, so its answer is about as long as the input."""
        cost = pricer.completion(body["input"], "input")
        self._check_context(cost, profile)
        cap = body.get("max_new_tokens")
        room = profile.context_length - cost.prompt_tokens
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            cap = profile.default_max_tokens
        cost.max_output_tokens = max(1, min(cap, room))
        cost.expected_output_tokens = max(1, min(cost.max_output_tokens, cost.text_tokens))
        cost.speech_seconds = self.speech.seconds(tenant, voice, cost.expected_output_tokens)
        return cost

    def _check_context(self, cost: Cost, profile: ModelProfile) -> None:
        """Reject what the backend would reject, giving estimated text the benefit of the doubt."""
        media = cost.vision_tokens + cost.audio_tokens
        lower_bound = media + int(cost.text_tokens * (1 - self.policy.context_text_slack))
        if lower_bound >= profile.context_length:
            raise ApiError(
                400,
                f"The input ({cost.prompt_tokens} tokens) is longer than the model's context length "
                f"({profile.context_length} tokens).",
                code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                param=None,
            )

    def observe(self, tenant: str, bucket: str, completion_tokens: int) -> None:
        """Feed the output learner with the completion tokens the backend reported (all choices). Prompt
        estimates are not learned: their error is a metric (`omnigate_estimation_ratio`)."""
        self.output.observe(tenant, bucket, completion_tokens)

    def observe_speech(self, tenant: str, voice: str, text_tokens: int, audio_seconds: float) -> None:
        """Feed the speech learner with one whole answer's text tokens and the audio seconds it held."""
        self.speech.observe(tenant, voice, text_tokens, audio_seconds)
