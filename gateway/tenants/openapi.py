"""OpenAPI 3.1 document for the admin API, with schemas generated from the pydantic models.

`openapi_paths()` is the tenants part; the gateway merges its own admin routes through `extra` (paths
relative to /admin, in OpenAPI path-item form).
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from gateway.tenants.models import KeyRecord, QuotasPatch, TenantCreate, TenantPatch, TenantSpec

REF = "#/components/schemas/{model}"
_TENANT = {"$ref": "#/components/schemas/TenantSpec"}
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


def _op(
    summary: str, ok: dict[str, Any] | None = None, body: str | None = None, status: str = "200"
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "security": [{"adminToken": []}],
        "responses": {
            status: {
                "description": "OK",
                "content": {"application/json": {"schema": ok or {"type": "object"}}},
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
        schema = {"$ref": f"#/components/schemas/{body}"}
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    return op


def openapi_paths() -> dict[str, Any]:
    listing = {"type": "object", "properties": {"object": {"const": "list"}, "data": {"type": "array"}}}
    key = {"$ref": "#/components/schemas/KeyRecord"}
    return {
        "/tenants": {
            "get": _op("List tenants", listing),
            "post": _op("Create a tenant (409 if the id exists)", _TENANT, "TenantCreate", "201"),
        },
        "/tenants/{tenant_id}": {
            "parameters": [_TENANT_ID],
            "get": _op("Get a tenant (stored fields plus `effective` values after policy defaults)", _TENANT),
            "patch": _op(
                "Update a tenant; only the given fields change, quotas merge field by field",
                _TENANT,
                "TenantPatch",
            ),
            "delete": _op("Delete a tenant and its keys (its usage ledger is kept)"),
        },
        "/tenants/{tenant_id}/quotas": {
            "parameters": [_TENANT_ID],
            "patch": _op("Change quotas live (next request); null removes a limit", None, "QuotasPatch"),
        },
        "/tenants/{tenant_id}/keys": {
            "parameters": [_TENANT_ID],
            "get": _op("List keys (display prefixes only)", listing),
            "post": _op(
                "Create a key; the response's `key` is the only time the plaintext is shown", key, None, "201"
            ),
        },
        "/tenants/{tenant_id}/keys/{key_id}": {
            "parameters": [_TENANT_ID, _KEY_ID],
            "delete": _op("Revoke a key", key),
        },
        "/tenants/{tenant_id}/usage": {
            "parameters": [_TENANT_ID, _DAYS],
            "get": _op("Remaining per-minute capacity, concurrency, day/month budgets, per-day history"),
        },
    }


def openapi_document(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    _, defs = models_json_schema(
        [(m, "validation") for m in (TenantCreate, TenantPatch, QuotasPatch, TenantSpec, KeyRecord)],
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
