"""Policy sections for the SLO-aware queue and the dispatcher.

Composed into gateway.livepolicy.policy.Policy under the keys queue, budgets, window, controller, fairness; a
pool's scheduler reads them as one `AdmissionSettings` (its own sections, not the whole policy). Sections with
a `pools` map hold per-pool overrides of the section's own defaults; `for_pool` resolves them.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import Field, model_validator

from gateway.settings.schema import Frozen, FrozenDict, drop_removed


class SLOClass(Frozen):
    """Service objectives of one traffic class (interactive, offline, ...)."""

    pool: str | None = None
    ttft_p99_s: float | None = Field(default=2.0, gt=0)
    tpot_p99_s: float | None = Field(default=0.06, gt=0)
    completion_deadline_s: float | None = Field(default=None, gt=0)
    max_queue_depth: int = Field(default=1024, ge=1)
    max_wait_s: float = Field(default=30.0, gt=0)
    shed_by_deadline: bool = True

    @property
    def deadline_budget_s(self) -> float | None:
        """Seconds from arrival to the deadline the queue orders by: first token, else completion."""
        return self.ttft_p99_s if self.ttft_p99_s is not None else self.completion_deadline_s


class PriorityPolicy(Frozen):
    levels: FrozenDict[str, int] = Field(default_factory=lambda: {"low": 0, "normal": 5, "high": 10})
    default: int = 5
    reserve_fraction: float = Field(
        default=0.15,
        ge=0,
        lt=1,
        description="Share of each backend's concurrency limit that bands below the top level leave free "
        "(rounded up): running generations cannot be preempted, so the top band needs free slots waiting.",
    )
    reserve_hold_s: float | None = Field(
        default=300.0,
        gt=0,
        description="Keep the band reserve only this long after the pool last saw a top-band request "
        "(null: always): a pool with no top-band traffic does not idle the reserve; the first top-band "
        "request after a quiet spell waits for one release, and the reserve is back for the next ones.",
    )

    @cached_property
    def top(self) -> int | None:
        """The top configured level: bands at or above it keep no reserve. (Cached: the levels never
        change, and every decision reads it.)"""
        return max(self.levels.values(), default=None)

    @cached_property
    def bottom(self) -> int | None:
        """The lowest configured level."""
        return min(self.levels.values(), default=None)

    @cached_property
    def ranked(self) -> tuple[tuple[int, str], ...]:
        """(value, name) of every level, highest first, names in order among equal values."""
        return tuple(
            sorted(((value, name) for name, value in self.levels.items()), key=lambda vn: (-vn[0], vn[1]))
        )

    def clamp(self, priority: int) -> int:
        """Into the configured levels' range (without levels: the default), so a client's `x-priority`
        can neither jump every band nor sink below the lowest one and grow a new band per value."""
        if self.top is None or self.bottom is None:
            return self.default
        return max(self.bottom, min(priority, self.top))

    def band(self, priority: int) -> str:
        """The name of the level a clamped priority falls in (the highest at or below it): what metrics
        label a priority by, so their label values are the policy's level names, never a client's number.
        """
        return next((name for value, name in self.ranked if value <= priority), "default")


class QueuePolicy(Frozen):
    classes: FrozenDict[str, SLOClass] = Field(
        default_factory=lambda: {
            "interactive": SLOClass(pool="interactive"),
            "offline": SLOClass(
                pool="offline",
                ttft_p99_s=None,
                tpot_p99_s=None,
                completion_deadline_s=3600.0,
                max_queue_depth=10000,
                max_wait_s=3600.0,
                shed_by_deadline=False,
            ),
        }
    )
    priorities: PriorityPolicy = Field(default_factory=PriorityPolicy)
    initial_prefill_tokens_per_s: float = Field(
        default=10000.0, gt=0, description="Per-backend prefill rate assumed until measurements arrive."
    )
    prefill_rate_window: int = Field(
        default=64, ge=1, description="Recent prefill-rate samples kept per pool."
    )
    prefill_rate_quantile: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Upper quantile of the recent per-request rates taken as the rate.",
    )
    prefill_rate_min_samples: int = Field(
        default=4,
        ge=1,
        description="Samples needed before measurements replace initial_prefill_tokens_per_s.",
    )
    prefill_rate_max_age_s: float = Field(
        default=30.0,
        gt=0,
        description="Samples older than this are forgotten, so a bad spell cannot outlive itself.",
    )
    prefill_rate_min_prompt_tokens: int = Field(
        default=512,
        ge=1,
        description="Smaller prompts give no rate sample: their TTFT is fixed overhead, not prefill.",
    )
    prefill_rate_floor_fraction: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="The rate never falls below this share of initial_prefill_tokens_per_s.",
    )
    refusal_confidence: float | None = Field(
        default=0.9,
        gt=0,
        lt=1,
        description="Admission refuses a request predicted to miss its deadline only if it would miss it "
        "even had it waited as little, against its prediction, as the quickest (1 − this) share of recent "
        "admitted requests that waited did (their actual ÷ predicted time to the first token). null: the "
        "prediction as it is.",
    )
    calibration_window: int = Field(
        default=128, ge=1, description="Recent actual ÷ predicted waits kept per pool for refusal_confidence."
    )
    calibration_min_samples: int = Field(
        default=16,
        ge=1,
        description="Waits measured before refusal_confidence relaxes the prediction (until then: as is).",
    )
    recheck_interval_s: float = Field(
        default=0.1, gt=0, description="How often waiting requests are re-checked."
    )
    rush_slack_fraction: float | None = Field(
        default=0.25,
        gt=0,
        lt=1,
        description="A queued request with a first-token deadline whose slack (deadline − now − its own "
        "prefill at the engine's nominal rate) falls under this share of its deadline budget goes at the "
        "next re-check to a backend with a free slot and room in the round's prefill budget, past the "
        "shield and its spacing. Keep it above recheck_interval_s ÷ the budget. null: off (the shield "
        "holds).",
    )
    lifo_after_fraction: float | None = Field(
        default=0.05,
        gt=0,
        description="Adaptive LIFO: while a tenant has had requests (of a class that sheds by deadline) "
        "waiting at a band without a break for longer than this share of the most urgent one's deadline "
        "budget, it is served newest first there — under overload they still have slack, the oldest would "
        "start at the edge of their deadline and are shed once late even if sent at once. null: always "
        "earliest deadline first (a backlog then serves every request at the edge of its deadline).",
    )


class LendPolicy(Frozen):
    """Lending this pool's backends to another pool's work (offline borrowing interactive backends)."""

    enabled: bool = False
    max_load: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A loan starts only while the backend's load (the larger of active / limit and KV "
        "occupancy / watermark) is below this.",
    )


class ShieldPolicy(Frozen):
    """Keeping lower-ranked prompts out of a higher-ranked request's prefill batch (shield.py)."""

    tokens: int | None = Field(
        default=512,
        gt=0,
        description="While higher-ranked requests (a higher band, or a tenant under its share) were "
        "dispatched in the pool within `hold_s`, a lower-ranked request goes to a backend only if the "
        "lower-ranked prompts sent there whose prefill has not started (no first byte yet) stay within "
        "this many tokens with it — or none wait. The engine batches every waiting prompt its budget "
        "allows with a new top-priority one: this bounds what rides along. None: off.",
    )
    hold_s: float = Field(
        default=10.0, gt=0, description="How long after the last higher-ranked dispatch the shield stays up."
    )
    duty: float | None = Field(
        default=0.1,
        gt=0,
        le=1,
        description="While the shield is up, the lower-ranked prompts above `tokens` (they go alone) take at "
        "most this share of a backend's time: after one goes there, the next waits for its predicted prefill "
        "(prompt / measured prefill rate) divided by this; smaller prompts pass it meanwhile. No engine "
        "preempts a prefill step in flight: a higher-ranked arrival waits for it, and the higher-ranked "
        "streams decoding there stall for it (SGLang runs a waiting prefill before the next decode step). "
        "None: as often as the other budgets allow.",
    )


class StagePolicy(Frozen):
    """Staged backends (sglang-omni): a budget per stage (gateway/admission/engine_stages.py). A limit left
    None is the server's own, as the pool's config and the backend's version tell it."""

    thinker: int | None = Field(default=None, ge=1, description="Thinker requests at once per backend.")
    talker: int | None = Field(default=None, ge=1, description="Talker requests at once per backend.")
    code2wav_audio_seconds_per_s: float | None = Field(
        default=None, gt=0, description="Audio seconds per second the vocoder makes: real-time streams."
    )
    encoder_batch: int | None = Field(default=None, ge=1, description="Media items waiting for one batch.")
    adaptive: bool = Field(
        default=True,
        description="The talker's budget follows the streams' real-time factor, code2wav's the audio rate "
        "measured from them.",
    )
    rtf_target: float = Field(
        default=0.8,
        gt=0,
        description="The real-time factor streams are kept at: speech goes while the streams fit the "
        "measured audio rate × this; a stream that ends above it shrinks the talker's budget.",
    )
    grow_below: float = Field(
        default=0.75, gt=0, le=1, description="Grow by one after a stream below rtf_target × this, if full."
    )
    decrease: float = Field(
        default=0.9,
        gt=0,
        lt=1,
        description="A too-slow stream shrinks them toward the streams that shared the vocoder with it × "
        "rtf_target / its RTF, by at most this factor per stream.",
    )
    min_speaking: int = Field(default=1, ge=1, description="The speaking budgets never shrink below this.")

    def limit(self, stage: str, server: float | None) -> float | None:
        """The stage's limit: the policy's if set, else the server's."""
        own = {
            "thinker": self.thinker,
            "talker": self.talker,
            "code2wav": self.code2wav_audio_seconds_per_s,
            "encoder": self.encoder_batch,
        }.get(stage)
        return float(own) if own is not None else server


class PlacementPolicy(Frozen):
    """Which of the backends a request fits on it goes to (gateway/admission/placement.py)."""

    policy: Literal["first_token", "least_tokens", "cache_aware"] = Field(
        default="first_token",
        description="first_token: the backend where its first token is predicted soonest — the prompt "
        "tokens waiting there for their prefill plus its own prompt less the prefix that backend is "
        "expected to hold cached (a warm backend wins unless it is loaded enough to lose); least_tokens: "
        "the least outstanding estimated tokens; cache_aware: sgl-model-gateway's rule — the least loaded "
        "backend when the loads are imbalanced, else the one holding the longest prefix if it covers "
        "more than `cache_threshold` of the prompt, else the least loaded.",
    )
    sticky: bool = Field(
        default=False,
        description="Keep a conversation on the backend it last went to while it fits there: the "
        "`x-session-id` header names it, else its first message after the system prompt.",
    )
    chunk_chars: int = Field(
        default=512,
        ge=16,
        description="Characters of text per chunk of the prefix index: a cached prefix is found to "
        "this granularity (a message always ends a chunk; every media item is one).",
    )
    index_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Prompt tokens each backend's prefix index remembers before it forgets the least "
        "recently sent; null: the backend's KV pool (`max_total_tokens`, as scraped), as its cache holds.",
    )
    cache_threshold: float = Field(
        default=0.3, ge=0, le=1, description="cache_aware: the prompt share a prefix must cover to win."
    )
    balance_abs_threshold: int = Field(
        default=64, ge=0, description="cache_aware: imbalanced when max − min requests exceed this ..."
    )
    balance_rel_threshold: float = Field(
        default=1.5, ge=1, description="cache_aware: ... and max exceeds min × this."
    )


class PoolBudgets(Frozen):
    """The per-backend budgets of one pool: prefill per round, KV watermark, modality bucket caps."""

    prefill_tokens_per_round: int = Field(default=8192, gt=0)
    prefill_rate_fraction: float | None = Field(
        default=None,
        gt=0,
        description="Adaptive prefill metering: when set, a round's prefill budget per backend is "
        "min(prefill_tokens_per_round, this × the measured prefill rate × round_s) — the engine's own pace, "
        "so the gateway's order (bands, VTC) rather than the engine's FIFO decides whose prefill runs next; "
        "a queue building in the engine lowers the measured rate and with it the budget. None: fixed.",
    )
    round_s: float = Field(
        default=0.1, gt=0, description="Length of one dispatch round (prefill budget period)."
    )
    kv_watermark: float = Field(default=0.85, gt=0, le=1)
    bucket_caps: FrozenDict[str, int] = Field(
        default_factory=lambda: {"multi_image": 16, "single_image": 64, "long_doc": 8}
    )
    lend: LendPolicy = Field(default_factory=LendPolicy)
    shield: ShieldPolicy = Field(default_factory=ShieldPolicy)
    stages: StagePolicy = Field(default_factory=StagePolicy)
    placement: PlacementPolicy = Field(default_factory=PlacementPolicy)


class BudgetPolicy(PoolBudgets):
    pools: FrozenDict[str, PoolBudgets] = Field(
        default_factory=dict,
        description="Per-pool overrides: each names only what differs; the rest is the budgets above.",
    )

    @model_validator(mode="before")
    @classmethod
    def _inherit(cls, data: Any) -> Any:
        """Fill each pool's override from the top-level budgets (a key it names replaces the whole value:
        `bucket_caps` given is the pool's whole map). Without this, `pools: {interactive: {lend: …}}`
        silently reset that pool's other budgets to the code defaults (adaptive metering off)."""
        if not isinstance(data, dict) or not isinstance(data.get("pools"), dict):
            return data
        base = {key: value for key, value in data.items() if key != "pools"}
        pools = {
            name: {**base, **override} if isinstance(override, dict) else override
            for name, override in data["pools"].items()
        }
        return {**data, "pools": pools}

    def for_pool(self, pool: str) -> PoolBudgets:
        return self.pools.get(pool) or self


class AccumulatePolicy(Frozen):
    """Offline pools: hold work until this many prefill tokens are queued or the oldest waited this long."""

    tokens: int = Field(default=32768, gt=0)
    max_wait_s: float = Field(default=2.0, ge=0)


_NO_LOAD_WINDOW = "rounds open as soon as requests wait, none grouped (decision 0108)"
REMOVED_WINDOW_KEYS = dict.fromkeys(
    ("enabled", "max_window_s", "light_load", "full_load", "slack_fraction"), _NO_LOAD_WINDOW
)


class WindowPolicy(Frozen):
    accumulate: FrozenDict[str, AccumulatePolicy] = Field(
        default_factory=lambda: {"offline": AccumulatePolicy()},
        description="Pool name → accumulate mode ({}: every pool's rounds open at once).",
    )

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        return drop_removed(data, "window", REMOVED_WINDOW_KEYS)


class ControllerPolicy(Frozen):
    algorithm: Literal["fixed", "aimd", "gradient", "target"] = "target"
    initial: int = Field(default=32, ge=1)
    min: int = Field(default=4, ge=1)
    max: int = Field(default=64, ge=1)
    smoothing: float = Field(default=0.2, gt=0, le=1, description="Weight of a new gradient proposal.")
    tolerance: float = Field(
        default=1.5, ge=1, description="Gradient: latency may grow this much over its baseline."
    )
    setpoint: float = Field(
        default=0.7, gt=0, le=1, description="Gradient: aim at this share of the SLO target."
    )
    long_alpha: float = Field(
        default=0.05, gt=0, le=1, description="Gradient: EWMA weight of the long baseline."
    )
    backoff: float = Field(
        default=0.9, gt=0, lt=1, description="AIMD: multiplicative decrease on a drop/SLO miss."
    )
    increase: float = Field(default=1.0, gt=0, description="AIMD: additive increase per good sample.")
    cooldown_s: float = Field(default=1.0, ge=0, description="No second decrease within this many seconds.")
    headroom: float = Field(
        default=0.9, gt=0, le=1, description="Target: aim the TPOT ratio's P99 at this share of the SLO."
    )
    window: int = Field(default=32, ge=4, description="Target: recent samples whose P90 is steered.")
    tail_window: int = Field(
        default=256, ge=4, description="Target: samples whose P99 / P90 ratio sets the P90 aimed at."
    )
    gain: float = Field(
        default=0.02, gt=0, le=1, description="Target: per sample, limit ← limit · (aim / recent P90)^gain."
    )
    duty: bool = Field(
        default=True,
        description="Target: derive the prefill duty from the decode step (false: the duty stays 1, the "
        "metered rounds give prefill the whole measured rate; an off switch for ablation, bench/family.py).",
    )
    tail_shape: bool = Field(
        default=True,
        description="Target: aim the recent P90 below headroom by the mix's P99 / P90 (false: aim it at "
        "headroom itself; an off switch for ablation, bench/family.py).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> ControllerPolicy:
        if not self.min <= self.initial <= self.max:
            raise ValueError(f"need min <= initial <= max, got {self.min}, {self.initial}, {self.max}")
        if self.tail_window < self.window:
            raise ValueError(f"need window <= tail_window, got {self.window}, {self.tail_window}")
        return self


class FairnessPolicy(Frozen):
    input_weight: float = Field(default=1.0, ge=0)
    output_weight: float = Field(default=2.0, ge=0)
    weights: FrozenDict[str, float] = Field(
        default_factory=dict, description="Tenant → VTC weight overriding the tenant store's weight."
    )
    reserve_fraction: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="A tenant holding its weighted fair share of a backend's slots (among the tenants "
        "waiting or running in the pool) leaves this further share of the limit free for the others.",
    )
    share_window_s: float = Field(
        default=60.0,
        gt=0,
        description="Time constant of the recent-service measure: a tenant whose weighted tokens "
        "dispatched over about this long are below its share (and who holds fewer slots than its share) "
        "is served first in its band and gets the higher engine priority.",
    )


class AdmissionSettings(Frozen):
    """The sections a pool's scheduler decides by, as one value (`Policy.admission`): admission depends
    on its own settings, not on the policy that composes them. `default_weight` weighs a tenant that
    neither `fairness.weights` nor the tenant store weighs (the policy's `tenant_defaults.weight`)."""

    queue: QueuePolicy = Field(default_factory=QueuePolicy)
    budgets: BudgetPolicy = Field(default_factory=BudgetPolicy)
    window: WindowPolicy = Field(default_factory=WindowPolicy)
    controller: ControllerPolicy = Field(default_factory=ControllerPolicy)
    fairness: FairnessPolicy = Field(default_factory=FairnessPolicy)
    default_weight: float = Field(default=1.0, gt=0)
