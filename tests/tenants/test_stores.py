"""One suite, every store (memory, sqlite file, real Redis): tenants, keys, auth and exact quota numbers."""

from __future__ import annotations

import asyncio

import pytest

from gateway.request.errors import ApiError
from gateway.tenants.models import QuotasPatch, TenantCreate, TenantPatch, TenantSpec
from gateway.tenants.service import QuotaExceeded, TenantService, parse_bootstrap
from gateway.tenants.settings import TenantDefaults
from tests.tenants.conftest import T0, FakeClock
from tests.tenants.test_quota import ts


async def make_tenant(service: TenantService, tenant_id: str = "acme", **fields: object) -> str:
    await service.create_tenant(TenantCreate.model_validate({"id": tenant_id, **fields}))
    _, key = await service.create_key(tenant_id, "k")
    return key


async def denial(service: TenantService, key: str, tokens_in: int, tokens_out: int) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as info:
        await service.reserve(await service.authenticate(f"Bearer {key}"), tokens_in, tokens_out)
    return info.value


async def test_tenant_crud_and_conflicts(service: TenantService) -> None:
    await make_tenant(service, "acme", name="Acme", quotas={"rpm": 10, "daily_tokens": 1000})
    with pytest.raises(ApiError) as dup:
        await service.create_tenant(TenantCreate(id="acme"))
    assert (dup.value.status, dup.value.code) == (409, "tenant_exists")
    patched = await service.update_tenant(
        "acme",
        TenantPatch(max_priority=3, quotas=QuotasPatch.model_validate({"rpm": 20, "daily_tokens": None})),
    )
    assert patched.quotas.rpm == 20 and patched.quotas.daily_tokens is None and patched.name == "Acme"
    assert (await service.get_tenant("acme")).max_priority == 3
    assert [t.id for t in await service.list_tenants()] == ["acme"]
    await service.delete_tenant("acme")
    for call in (service.get_tenant("acme"), service.delete_tenant("acme"), service.list_keys("acme")):
        with pytest.raises(ApiError) as missing:
            await call
        assert (missing.value.status, missing.value.code) == (404, "tenant_not_found")


async def test_keys_authenticate_revoke_and_die_with_their_tenant(
    service: TenantService, clock: FakeClock
) -> None:
    key = await make_tenant(service, "acme")
    clock.advance(1)
    assert key.startswith("og-") and len(key) > 40
    assert (await service.authenticate(f"Bearer {key}")).id == "acme"
    second, key2 = await service.create_key("acme", "ci")
    listed = await service.list_keys("acme")
    assert [k.name for k in listed] == ["k", "ci"]
    assert all(key not in str(k.public()) and "key_hash" not in k.public().model_dump() for k in listed)
    assert listed[1].prefix == key2[:7]  # "og-" and 4 random characters
    await service.revoke_key("acme", second.id)
    assert (await service.list_keys("acme"))[1].revoked
    for header, code in (
        (None, "missing_api_key"),
        ("Basic x", "missing_api_key"),
        (f"Bearer {key2}", "invalid_api_key"),
        ("Bearer og-nope", "invalid_api_key"),
    ):
        with pytest.raises(ApiError) as err:
            await service.authenticate(header)
        assert (err.value.status, err.value.code) == (401, code)
    await service.delete_tenant("acme")
    with pytest.raises(ApiError) as gone:
        await service.authenticate(f"Bearer {key}")
    assert gone.value.code == "invalid_api_key"


async def test_refill_retry_after_and_reconcile_are_exact(service: TenantService, clock: FakeClock) -> None:
    key = await make_tenant(service, quotas={"total_tpm": 600, "output_tpm": 300})
    tenant = await service.authenticate(f"Bearer {key}")
    res = await service.reserve(tenant, 300, 300)
    err = await denial(service, key, 60, 0)
    assert (err.status, err.code, err.limit) == (429, "tokens_per_minute_exceeded", "total_tpm")
    assert err.retry_after == pytest.approx(6.0) and err.response_headers()["retry-after"] == "6"
    await service.reconcile(res, 300, 100)  # returns 200 output tokens
    await service.reconcile(res, 0, 0)  # idempotent
    assert (await service.usage("acme"))["per_minute"] == {
        "total_tpm": {"limit": 600, "remaining": 200.0, "used": 400.0},
        "output_tpm": {"limit": 300, "remaining": 200.0, "used": 100.0},
    }
    clock.advance(30)
    res2 = await service.reserve(tenant, 200, 300)  # takes all 500 total and 300 output tokens
    err = await denial(service, key, 0, 1)  # output refills in 0.2 s, total in 0.1 s: the longer wins
    assert (err.limit, err.retry_after) == ("output_tpm", pytest.approx(0.2))
    await service.reconcile(res2, 200, 900)  # aborted/long stream: charged what it generated
    usage = await service.usage("acme")
    assert usage["per_minute"]["total_tpm"]["remaining"] == pytest.approx(-600.0)
    assert usage["today"] | {"resets_in_s": 0} == {
        "date": "2025-03-10",
        "input_tokens": 500,
        "output_tokens": 1000,
        "total_tokens": 1500,
        "requests": 2,
        "audio_seconds": 0.0,
        "limit": None,
        "remaining": None,
        "audio_seconds_limit": None,
        "audio_seconds_remaining": None,
        "resets_in_s": 0,
    }


async def test_audio_seconds_are_reserved_as_predicted_and_reconciled_as_delivered(
    service: TenantService, clock: FakeClock
) -> None:
    key = await make_tenant(service, quotas={"audio_spm": 60})
    tenant = await service.authenticate(f"Bearer {key}")
    spoken = await service.reserve(tenant, 10, 20, audio_seconds=40.0)
    with pytest.raises(QuotaExceeded) as info:
        await service.reserve(tenant, 10, 20, audio_seconds=30.0)  # 30 s wanted, 20 s left: 10 s of refill
    err = info.value
    assert (err.status, err.code, err.limit) == (429, "audio_seconds_per_minute_exceeded", "audio_spm")
    assert err.retry_after == pytest.approx(10.0)
    await service.reconcile(spoken, 10, 20, audio_seconds=25.5)  # spoke less than predicted: 14.5 s back
    assert (await service.usage("acme"))["per_minute"] == {
        "audio_spm": {"limit": 60, "remaining": 34.5, "used": 25.5}
    }
    longer = await service.reserve(tenant, 10, 20, audio_seconds=30.0)
    await service.reconcile(longer, 10, 20, audio_seconds=50.25)  # spoke longer: 20.25 s of debt
    usage = await service.usage("acme")
    assert usage["per_minute"]["audio_spm"]["remaining"] == pytest.approx(-15.75)
    text = await service.reserve(tenant, 10, 20)  # a text answer is not held back by the speech debt
    with pytest.raises(QuotaExceeded):
        await service.reserve(tenant, 10, 20, audio_seconds=0.5)
    await service.reconcile(text, 10, 20)
    clock.advance(16.25)  # the debt refilled, and 0.5 s more
    await service.reserve(tenant, 10, 20, audio_seconds=0.5)
    usage = await service.usage("acme")
    assert (usage["today"]["audio_seconds"], usage["month"]["audio_seconds"]) == (76.25, 76.25)
    assert usage["today"]["requests"] == 4


async def test_concurrency_limit_and_release(service: TenantService) -> None:
    key = await make_tenant(service, quotas={"max_concurrent": 2})
    tenant = await service.authenticate(f"Bearer {key}")
    first = await service.reserve(tenant, 1, 1)
    await service.reserve(tenant, 1, 1)
    assert (await denial(service, key, 1, 1)).code == "concurrent_requests_exceeded"
    assert (await service.usage("acme"))["concurrent"] == {"limit": 2, "active": 2}
    await service.reconcile(first, 0, 0)
    await service.reserve(tenant, 1, 1)


async def test_budgets_roll_over_at_utc_day_and_month(service: TenantService, clock: FakeClock) -> None:
    clock.now = ts(2025, 1, 31, 23, 59, 30)
    key = await make_tenant(service, quotas={"daily_tokens": 1000, "monthly_tokens": 1500})
    tenant = await service.authenticate(f"Bearer {key}")
    await service.reserve(tenant, 900, 100)
    err = await denial(service, key, 1, 0)
    assert (err.code, err.retry_after) == ("daily_token_budget_exceeded", pytest.approx(30.0))
    clock.advance(30)  # 1 February: a new day and a new month
    await service.reserve(tenant, 1000, 0)
    assert (await denial(service, key, 1, 0)).code == "daily_token_budget_exceeded"
    clock.now = ts(2025, 2, 2, 0, 0, 0)
    await service.reserve(tenant, 400, 100)
    err = await denial(service, key, 1, 0)
    assert (err.code, err.retry_after) == ("monthly_token_budget_exceeded", pytest.approx(27 * 86400.0))
    usage = await service.usage("acme", days=3)
    assert usage["month"]["total_tokens"] == 1500 and usage["month"]["remaining"] == 0
    assert [(d["date"], d["total_tokens"]) for d in usage["history"]] == [
        ("2025-02-02", 500),
        ("2025-02-01", 1000),
        ("2025-01-31", 1000),
    ]


async def test_audio_budgets_roll_over_and_hold_back_only_speech(
    service: TenantService, clock: FakeClock
) -> None:
    clock.now = ts(2025, 1, 31, 23, 59, 0)
    key = await make_tenant(service, quotas={"daily_audio_seconds": 60, "monthly_audio_seconds": 100})
    tenant = await service.authenticate(f"Bearer {key}")
    spoken = await service.reserve(tenant, 10, 10, audio_seconds=50.0)
    await service.reconcile(spoken, 10, 10, audio_seconds=55.5)  # spoke longer than predicted
    with pytest.raises(QuotaExceeded) as info:
        await service.reserve(tenant, 10, 10, audio_seconds=5.0)  # 55.5 + 5 > 60
    assert (info.value.code, info.value.retry_after) == ("daily_audio_budget_exceeded", pytest.approx(60.0))
    await service.reserve(tenant, 10, 10, audio_seconds=4.5)  # exactly the 60 s left of the day
    text = await service.reserve(tenant, 10, 10)  # text is not held back by an audio budget
    await service.reconcile(text, 10, 10)
    clock.advance(60)  # 1 February: a new day and a new month
    await service.reserve(tenant, 10, 10, audio_seconds=60.0)
    usage = await service.usage("acme")
    assert usage["today"]["audio_seconds_remaining"] == 0.0
    assert (usage["month"]["audio_seconds_limit"], usage["month"]["audio_seconds_remaining"]) == (100, 40.0)
    clock.now = ts(2025, 2, 2, 0, 0, 0)
    await service.reserve(tenant, 10, 10, audio_seconds=40.0)
    with pytest.raises(QuotaExceeded) as info:
        await service.reserve(tenant, 10, 10, audio_seconds=0.001)
    assert (info.value.code, info.value.retry_after) == (
        "monthly_audio_budget_exceeded",
        pytest.approx(27 * 86400.0),
    )


async def test_many_concurrent_reservations_never_overshoot_by_more_than_one(service: TenantService) -> None:
    key = await make_tenant(service, quotas={"total_tpm": 10_000})
    tenant = await service.authenticate(f"Bearer {key}")

    async def attempt() -> int:
        try:
            await service.reserve(tenant, 200, 100)
        except QuotaExceeded:
            return 0
        return 300

    admitted = sum(await asyncio.gather(*(attempt() for _ in range(100))))
    assert admitted == 9900  # 33 reservations: the 34th would need 300 with 100 left


async def test_quota_patch_applies_to_the_next_request(service: TenantService) -> None:
    key = await make_tenant(service, quotas={"rpm": 1})
    await service.reserve(await service.authenticate(f"Bearer {key}"), 1, 1)
    assert (await denial(service, key, 1, 1)).code == "requests_per_minute_exceeded"
    await service.update_tenant("acme", TenantPatch(quotas=QuotasPatch.model_validate({"rpm": None})))
    await service.reserve(await service.authenticate(f"Bearer {key}"), 1, 1)


async def test_policy_defaults_resolve_live_and_priority_is_clamped(service: TenantService) -> None:
    key = await make_tenant(service, "a")
    key_b = await make_tenant(
        service, "b", max_priority=9, allowed_models=["qwen*"], allowed_classes=["offline"]
    )
    a = await service.authenticate(f"Bearer {key}")
    assert (service.effective_priority(a, None), service.effective_priority(a, 100)) == (5, 5)
    service.set_defaults(TenantDefaults(default_priority=2, max_priority=8))
    a = await service.authenticate(f"Bearer {key}")
    assert [service.effective_priority(a, p) for p in (None, 7, 100, -3)] == [2, 7, 8, -3]
    b = await service.authenticate(f"Bearer {key_b}")
    assert service.effective_priority(b, 100) == 9
    service.check_model(b, "qwen2.5-omni-7b")
    assert service.traffic_class(b, "offline") == "offline"
    with pytest.raises(ApiError) as model:
        service.check_model(b, "llama-3")
    with pytest.raises(ApiError) as cls:
        service.traffic_class(b, None)  # default class interactive is not among b's classes
    assert (model.value.status, model.value.code, cls.value.code) == (
        403,
        "model_not_allowed",
        "class_not_allowed",
    )


async def test_a_tenant_changed_after_a_request_is_seen_changed_by_the_next(service: TenantService) -> None:
    key = await make_tenant(service, "acme", max_priority=4)
    first = await service.authenticate(f"Bearer {key}")
    assert first.max_priority == 4
    assert await service.authenticate(f"Bearer {key}") == first
    await service.update_tenant("acme", TenantPatch(max_priority=2, weight=3.0))
    changed = await service.authenticate(f"Bearer {key}")
    assert (changed.max_priority, changed.weight) == (2, 3.0)


async def test_new_tenants_take_default_quotas(service: TenantService) -> None:
    service.set_defaults(TenantDefaults(quotas={"rpm": 7}))
    assert (await service.create_tenant(TenantCreate(id="x"))).quotas.rpm == 7
    assert (
        await service.create_tenant(TenantCreate.model_validate({"id": "y", "quotas": {}}))
    ).quotas.rpm is None


async def test_bootstrap_tenants_are_created_once(service: TenantService) -> None:
    service.bootstrap = [
        __import__("gateway.tenants.service", fromlist=["BootstrapTenant"]).BootstrapTenant(
            id="demo", keys=["og-demo-key-0123456789"], quotas={"rpm": 5}
        )
    ]
    await service._bootstrap()
    await service.update_tenant("demo", TenantPatch(quotas=QuotasPatch(rpm=9)))
    await service._bootstrap()
    tenant = await service.authenticate("Bearer og-demo-key-0123456789")
    assert (tenant.id, tenant.quotas.rpm, len(await service.list_keys("demo"))) == ("demo", 9, 1)
    assert T0 > 0


async def test_a_bootstrap_tenant_another_replica_created_meanwhile_is_no_error(
    service: TenantService,
) -> None:
    """Two workers start together: each finds the config's tenant missing, one creates it first. The
    other's create finds it there; it goes on to the keys instead of failing its start-up."""
    entry = parse_bootstrap([{"id": "raced", "keys": ["og-raced-key-0123456789"]}])
    service.bootstrap = entry
    await service.create_tenant(TenantCreate(id="raced"))  # the other worker, between read and write
    store = service.store
    real_get = store.get_tenant

    async def not_yet(tenant_id: str) -> TenantSpec | None:  # what this worker read before that
        return None if tenant_id == "raced" else await real_get(tenant_id)

    store.get_tenant = not_yet  # type: ignore[method-assign]
    await service._bootstrap()
    store.get_tenant = real_get  # type: ignore[method-assign]
    assert (await service.authenticate("Bearer og-raced-key-0123456789")).id == "raced"
