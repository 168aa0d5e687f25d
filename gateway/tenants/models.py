"""Tenant, quota and API-key records as stored, plus the resolved view the request path reads.

A stored `TenantSpec` leaves the policy-tunable fields (weight, priorities, classes, over-quota mode) as
None so that a policy reload changes every tenant that did not set its own value; `TenantSpec.resolve`
turns it into a concrete, frozen `Tenant` for one request. Quotas are stored per tenant (None = unlimited)
and seeded from the policy defaults when a tenant is created without them.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from gateway.settings.schema import Frozen

OverQuota = Literal["reject", "wait"]
TENANT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
KEY_PREFIX = "og-"
KEY_DISPLAY_CHARS = 7  # "og-" and 4 random characters: 24 of a generated key's 256 bits


def _whole(value: object) -> object:
    """JSON Schema's integer includes 3.0; the admin API parses strictly (no true as 1, no "3")."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Integers as JSON Schema has them, under the admin API's strict parsing (the bounds stay ahead of the
# validator, or pydantic leaves them out of the published schema); quotas stay within the integers a
# double (Redis's Lua) and JSON carry exactly.
MAX_QUOTA = 2**53 - 1
PRIORITY_BOUND = 2**31 - 1
Limit = Annotated[int, Field(ge=1, le=MAX_QUOTA), BeforeValidator(_whole)]
QueueLimit = Annotated[int, Field(ge=0, le=MAX_QUOTA), BeforeValidator(_whole)]
Priority = Annotated[int, Field(ge=-PRIORITY_BOUND, le=PRIORITY_BOUND), BeforeValidator(_whole)]


def display_prefix(key: str) -> str:
    """What listings and logs show of a key: at most a quarter of it, never over KEY_DISPLAY_CHARS, so a
    short key declared in the config ("sk-demo-alice") shows "sk-" rather than half of itself."""
    return key[: min(KEY_DISPLAY_CHARS, len(key) // 4)]


class Quotas(Frozen):
    """Per-tenant limits; None means unlimited. Token limits count image/audio tokens as input."""

    input_tpm: Limit | None = Field(default=None, description="Input (prompt) tokens per minute.")
    output_tpm: Limit | None = Field(default=None, description="Output tokens per minute.")
    total_tpm: Limit | None = Field(default=None, description="Input plus output tokens per minute.")
    rpm: Limit | None = Field(default=None, description="Requests per minute.")
    audio_spm: Limit | None = Field(
        default=None,
        description="Audio seconds per minute that answers speak (speech out).",
    )
    max_concurrent: Limit | None = Field(default=None, description="Requests admitted and not yet finished.")
    max_queued: QueueLimit | None = Field(
        default=None, description="Requests waiting in one replica's queue."
    )
    daily_tokens: Limit | None = Field(default=None, description="Token budget per UTC day.")
    monthly_tokens: Limit | None = Field(default=None, description="Token budget per UTC calendar month.")
    daily_audio_seconds: Limit | None = Field(
        default=None, description="Audio seconds answers may speak per UTC day."
    )
    monthly_audio_seconds: Limit | None = Field(
        default=None,
        description="Audio seconds answers may speak per UTC calendar month.",
    )


class _Editable(BaseModel):
    """Fields an admin may set; shared by create, patch and the stored record."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=200)
    weight: float | None = Field(default=None, gt=0, description="Fair-share weight; None = policy default.")
    default_priority: Priority | None = None
    max_priority: Priority | None = None
    default_class: str | None = Field(default=None, min_length=1)
    allowed_classes: list[str] | None = Field(
        default=None, description="None = policy default; [] = any class."
    )
    allowed_models: list[str] = Field(default_factory=list, description="Model globs; [] = all models.")
    over_quota: OverQuota | None = Field(
        default=None, description="reject (429) or wait in the queue for refill."
    )


class TenantCreate(_Editable):
    id: str = Field(pattern=TENANT_ID_PATTERN)
    quotas: Quotas | None = Field(default=None, description="Omitted = the policy's default quotas.")


class TenantPatch(BaseModel):
    """Partial update: only the fields present in the request body change (quotas merge field by field).
    A null resets a policy-tunable field to the policy's default; `name`, `allowed_models` and `quotas`
    have no default to return to, so a null there is refused (400 naming it)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=200)
    weight: float | None = Field(default=None, gt=0)
    default_priority: Priority | None = None
    max_priority: Priority | None = None
    default_class: str | None = Field(default=None, min_length=1)
    allowed_classes: list[str] | None = None
    allowed_models: list[str] = Field(default_factory=list)
    over_quota: OverQuota | None = None
    quotas: QuotasPatch = Field(default_factory=lambda: QuotasPatch())


class QuotasPatch(BaseModel):
    """Quota fields to change; an explicit null removes that limit."""

    model_config = ConfigDict(extra="forbid")

    input_tpm: Limit | None = None
    output_tpm: Limit | None = None
    total_tpm: Limit | None = None
    rpm: Limit | None = None
    audio_spm: Limit | None = None
    max_concurrent: Limit | None = None
    max_queued: QueueLimit | None = None
    daily_tokens: Limit | None = None
    monthly_tokens: Limit | None = None
    daily_audio_seconds: Limit | None = None
    monthly_audio_seconds: Limit | None = None

    def apply(self, quotas: Quotas) -> Quotas:
        return quotas.model_copy(update=self.model_dump(exclude_unset=True))


TenantPatch.model_rebuild()


class TenantSpec(_Editable):
    """The stored tenant record."""

    id: str = Field(pattern=TENANT_ID_PATTERN)
    quotas: Quotas = Field(default_factory=Quotas)
    created_at: float = 0.0
    updated_at: float = 0.0

    def patched(self, patch: TenantPatch, now: float) -> TenantSpec:
        update = patch.model_dump(exclude_unset=True, exclude={"quotas"})
        if "quotas" in patch.model_fields_set:
            update["quotas"] = patch.quotas.apply(self.quotas)
        update["updated_at"] = now
        return TenantSpec.model_validate({**self.model_dump(), **update})

    def resolve(self, defaults: TenantDefaultsLike) -> Tenant:
        max_priority = self.max_priority if self.max_priority is not None else defaults.max_priority
        default_priority = (
            self.default_priority if self.default_priority is not None else defaults.default_priority
        )
        classes = self.allowed_classes if self.allowed_classes is not None else defaults.allowed_classes
        return Tenant(
            id=self.id,
            name=self.name,
            weight=self.weight if self.weight is not None else defaults.weight,
            default_priority=min(default_priority, max_priority),
            max_priority=max_priority,
            default_class=self.default_class or defaults.default_class,
            allowed_classes=tuple(classes),
            allowed_models=tuple(self.allowed_models),
            quotas=self.quotas,
            over_quota=self.over_quota or defaults.over_quota,
        )


class TenantDefaultsLike(Protocol):
    """The fields of the policy's TenantDefaults that resolution reads (a protocol avoids an import cycle)."""

    @property
    def weight(self) -> float: ...
    @property
    def default_priority(self) -> int: ...
    @property
    def max_priority(self) -> int: ...
    @property
    def default_class(self) -> str: ...
    @property
    def allowed_classes(self) -> Sequence[str]: ...
    @property
    def over_quota(self) -> OverQuota: ...


class Tenant(BaseModel):
    """A tenant with every policy default filled in: what the request path reads."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    weight: float
    default_priority: int
    max_priority: int
    default_class: str
    allowed_classes: tuple[str, ...]
    allowed_models: tuple[str, ...]
    quotas: Quotas
    over_quota: OverQuota


class TenantView(TenantSpec):
    """A tenant as the admin API answers it: the stored fields plus `effective`, the values the request
    path uses after the policy's defaults."""

    effective: Tenant


class KeyRecord(BaseModel):
    """An API key as stored: its hash and a short display prefix, never the plaintext."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    tenant_id: str
    key_hash: str
    prefix: str
    name: str = ""
    created_at: float = 0.0
    revoked_at: float | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def public(self) -> KeyView:
        """What admin listings show: everything but the hash (a prefix stored longer, before keys showed
        less, is cut to today's length)."""
        return KeyView(
            **self.model_dump(exclude={"key_hash", "prefix"}), prefix=self.prefix[:KEY_DISPLAY_CHARS]
        )


class KeyView(BaseModel):
    """A key as the admin API shows it: no hash, a display prefix."""

    id: str
    tenant_id: str
    prefix: str
    name: str
    created_at: float
    revoked_at: float | None


class KeyCreated(KeyView):
    key: str = Field(description="The plaintext key: shown here once, never stored or shown again.")


class KeyCreate(BaseModel):
    """The optional body of a key's creation."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=200)


class TenantList(BaseModel):
    object: Literal["list"] = "list"
    data: list[TenantView]


class KeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[KeyView]


class Deleted(BaseModel):
    id: str
    deleted: Literal[True] = True


def hash_key(plaintext: str) -> str:
    """sha256 is enough here: keys carry 256 random bits, so there is nothing to brute-force or salt."""
    return hashlib.sha256(plaintext.encode()).hexdigest()


def new_key(tenant_id: str, name: str, now: float, plaintext: str | None = None) -> tuple[KeyRecord, str]:
    """A fresh key record and its plaintext (generated unless given, e.g. bootstrap keys from config)."""
    key = plaintext or KEY_PREFIX + secrets.token_urlsafe(32)
    record = KeyRecord(
        id="key_" + secrets.token_hex(6),
        tenant_id=tenant_id,
        key_hash=hash_key(key),
        prefix=display_prefix(key),
        name=name,
        created_at=now,
    )
    return record, key
