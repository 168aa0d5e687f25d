"""OpenAPI 3.1 document for the admin API, with schemas generated from the pydantic models the routes
parse (validation schemas) and answer (serialization schemas), so the document and the API cannot part.

`openapi_paths()` is the tenants part; the gateway merges its own admin routes through `extra` (paths
relative to /admin, in OpenAPI path-item form). tests/integration/test_admin_schema_e2e.py runs
schemathesis against a live gateway with this document.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from gateway.tenants.models import (
    Deleted,
    KeyCreate,
    KeyCreated,
    KeyList,
    KeyView,
    Quotas,
    QuotasPatch,
    TenantCreate,
    TenantList,
    TenantPatch,
    TenantView,
)

REF = "#/components/schemas/{model}"
REQUESTS: tuple[type[BaseModel], ...] = (TenantCreate, TenantPatch, QuotasPatch, KeyCreate)
ANSWERS: tuple[type[BaseModel], ...] = (TenantView, TenantList, KeyView, KeyCreated, KeyList, Deleted, Quotas)
_ERROR = {
    "description": "Error (OpenAI-style body: {error: {message, type, param, code}})",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_TENANT_ID = {"name": "tenant_id", "in": "path", "required": True, "schema": {"type": "string"}}
_KEY_ID = {"name": "key_id", "in": "path", "required": True, "schema": {"type": "string"}}
_DAYS = {
    "name": "days",
    "in": "query",
    "schema": {"type": "integer", "minimum": 1, "maximum": 400, "default": 7},
}


def _ref(model: type[BaseModel]) -> dict[str, Any]:
    return {"$ref": REF.format(model=model.__name__)}


def _op(
    summary: str,
    ok: type[BaseModel] | None = None,
    body: type[BaseModel] | None = None,
    status: str = "200",
    body_required: bool = True,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "security": [{"adminToken": []}],
        "responses": {
            status: {
                "description": "OK",
                "content": {"application/json": {"schema": _ref(ok) if ok else {"type": "object"}}},
            },
            "400": _ERROR,
            "401": _ERROR,
            "403": _ERROR,
            "404": _ERROR,
            "409": _ERROR,
            "503": _ERROR,
        },
    }
    if body:
        content = {"application/json": {"schema": _ref(body)}}
        op["requestBody"] = {"required": body_required, "content": content}
    return op


def openapi_paths() -> dict[str, Any]:
    return {
        "/tenants": {
            "get": _op("List tenants", TenantList),
            "post": _op("Create a tenant (409 if the id exists)", TenantView, TenantCreate, "201"),
        },
        "/tenants/{tenant_id}": {
            "parameters": [_TENANT_ID],
            "get": _op(
                "Get a tenant (stored fields plus `effective` values after policy defaults)", TenantView
            ),
            "patch": _op(
                "Update a tenant; only the given fields change, quotas merge field by field; null resets a "
                "policy-tunable field to the policy's default",
                TenantView,
                TenantPatch,
            ),
            "delete": _op("Delete a tenant and its keys (its usage ledger is kept)", Deleted),
        },
        "/tenants/{tenant_id}/quotas": {
            "parameters": [_TENANT_ID],
            "patch": _op("Change quotas live (next request); null removes a limit", Quotas, QuotasPatch),
        },
        "/tenants/{tenant_id}/keys": {
            "parameters": [_TENANT_ID],
            "get": _op("List keys (display prefixes only)", KeyList),
            "post": _op(
                "Create a key; the response's `key` is the only time the plaintext is shown",
                KeyCreated,
                KeyCreate,
                "201",
                body_required=False,
            ),
        },
        "/tenants/{tenant_id}/keys/{key_id}": {
            "parameters": [_TENANT_ID, _KEY_ID],
            "delete": _op("Revoke a key", KeyView),
        },
        "/tenants/{tenant_id}/usage": {
            "parameters": [_TENANT_ID, _DAYS],
            "get": _op("Remaining per-minute capacity, concurrency, day/month budgets, per-day history"),
        },
    }


def openapi_document(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    _, defs = models_json_schema(
        [*((m, "validation") for m in REQUESTS), *((m, "serialization") for m in ANSWERS)],
        ref_template=REF,
    )
    schemas = defs.get("$defs", {})
    schemas["Error"] = {
        "type": "object",
        "properties": {
            "error": {"type": "object", "properties": {k: {} for k in ("message", "type", "param", "code")}}
        },
    }
    paths = {**openapi_paths(), **(extra or {})}
    return {
        "openapi": "3.1.0",
        "info": {"title": "omnigate admin API", "version": "1"},
        "servers": [{"url": "/admin"}],
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": schemas,
            "securitySchemes": {"adminToken": {"type": "http", "scheme": "bearer"}},
        },
    }
