"""Policy section: defaults applied to tenants that do not set their own values (owned by tenants).

Weight, priorities, classes and the over-quota mode resolve live (a policy reload changes every tenant
that left them unset); `quotas` seeds the quotas of tenants created without any.
"""

from __future__ import annotations

from pydantic import Field

from gateway.settings.schema import Frozen
from gateway.tenants.models import OverQuota, Quotas


class TenantDefaults(Frozen):
    weight: float = Field(default=1.0, gt=0)
    default_priority: int = 5
    max_priority: int = 5
    default_class: str = "interactive"
    allowed_classes: tuple[str, ...] = Field(default=(), description="[] = any traffic class.")
    over_quota: OverQuota = "reject"
    quotas: Quotas = Field(default_factory=Quotas)
    cached_input_share: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="The share of the full price a prompt token the engine served from its prefix cache "
        "is charged at (SGLang reports them with --enable-cache-report; most providers bill them at "
        "0.1–0.5). 1: full price, as if nothing were cached.",
    )
