"""`omnigate tenants …`: the admin API for ops at a shell. Tables by default, `--json` for scripts.

Exit codes: 0 ok, 1 the API refused (message printed), 2 the gateway could not be reached.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.table import Table

TENANT_FLAGS = (
    "name",
    "weight",
    "default_priority",
    "max_priority",
    "default_class",
    "allowed_classes",
    "allowed_models",
    "over_quota",
)
QUOTA_FLAGS = (
    "input_tpm",
    "output_tpm",
    "total_tpm",
    "rpm",
    "audio_spm",
    "max_concurrent",
    "max_queued",
    "daily_tokens",
    "monthly_tokens",
    "daily_audio_seconds",
    "monthly_audio_seconds",
)


def _limit(text: str) -> int | None:
    """A quota value on the command line: an integer, or `none` to remove the limit."""
    if text.lower() in ("none", "null", "unlimited"):
        return None
    return int(text)


def _list(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("OMNIGATE_URL", "http://127.0.0.1:8080"))
    common.add_argument("--token", default=os.environ.get("OMNIGATE_ADMIN_TOKEN"), help="admin token")
    common.add_argument("--json", action="store_true", help="print the API's JSON")

    fields = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    fields.add_argument("--name")
    fields.add_argument("--weight", type=float)
    fields.add_argument("--default-priority", type=int)
    fields.add_argument("--max-priority", type=int)
    fields.add_argument("--default-class")
    fields.add_argument("--allowed-classes", type=_list, help="comma-separated; empty = any")
    fields.add_argument("--allowed-models", type=_list, help="comma-separated globs; empty = all")
    fields.add_argument("--over-quota", choices=["reject", "wait"])
    for name in QUOTA_FLAGS:
        fields.add_argument("--" + name.replace("_", "-"), type=_limit, metavar="N|none")

    parser = argparse.ArgumentParser(
        prog="omnigate tenants", description="Manage tenants through the admin API."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", parents=[common], help="list tenants")
    for name, helptext in (("get", "show a tenant"), ("delete", "delete a tenant and its keys")):
        sub.add_parser(name, parents=[common], help=helptext).add_argument("tenant_id")
    for name in ("create", "update"):
        sub.add_parser(name, parents=[common, fields], help=f"{name} a tenant").add_argument("tenant_id")
    usage = sub.add_parser("usage", parents=[common], help="rates, budgets and history of a tenant")
    usage.add_argument("tenant_id")
    usage.add_argument("--days", type=int, default=7)
    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="keys_command", required=True)
    keys.add_parser("list", parents=[common]).add_argument("tenant_id")
    create = keys.add_parser("create", parents=[common], help="create a key (its plaintext is shown once)")
    create.add_argument("tenant_id")
    create.add_argument("--name", default="")
    revoke = keys.add_parser("revoke", parents=[common])
    revoke.add_argument("tenant_id")
    revoke.add_argument("key_id")
    return parser


def _body(args: argparse.Namespace) -> dict[str, Any]:
    """Only the flags that were given (the rest are suppressed): create leaves the others to defaults,
    update leaves them unchanged."""
    body = {k: getattr(args, k) for k in TENANT_FLAGS if hasattr(args, k)}
    quotas = {k: getattr(args, k) for k in QUOTA_FLAGS if hasattr(args, k)}
    return body | ({"quotas": quotas} if quotas else {})


def _request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    t = getattr(args, "tenant_id", "")
    if args.command == "list":
        return "GET", "/admin/tenants", None
    if args.command == "get":
        return "GET", f"/admin/tenants/{t}", None
    if args.command == "delete":
        return "DELETE", f"/admin/tenants/{t}", None
    if args.command == "create":
        return "POST", "/admin/tenants", {"id": t, **_body(args)}
    if args.command == "update":
        return "PATCH", f"/admin/tenants/{t}", _body(args)
    if args.command == "usage":
        return "GET", f"/admin/tenants/{t}/usage?days={args.days}", None
    if args.keys_command == "list":
        return "GET", f"/admin/tenants/{t}/keys", None
    if args.keys_command == "create":
        return "POST", f"/admin/tenants/{t}/keys", {"name": args.name}
    return "DELETE", f"/admin/tenants/{t}/keys/{args.key_id}", None


def _table(title: str, rows: list[dict[str, Any]], columns: Sequence[str]) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    return table


def _render(console: Console, args: argparse.Namespace, data: dict[str, Any]) -> None:
    command = args.keys_command if args.command == "keys" else args.command
    if args.command == "keys" and command == "list":
        console.print(_table("keys", data["data"], ["id", "prefix", "name", "created_at", "revoked_at"]))
    elif args.command == "keys" and command == "create":
        console.print(
            f"key {data['id']} created for {data['tenant_id']}. Store it now, it is not shown again:"
        )
        console.print(data["key"], markup=False, highlight=False)
    elif command == "list":
        rows = [{**t, **{k: v for k, v in t["quotas"].items() if v is not None}} for t in data["data"]]
        console.print(_table("tenants", rows, ["id", "name", "weight", "max_priority", *QUOTA_FLAGS]))
    elif command == "usage":
        rows = [{"name": k, **v} for k, v in data["per_minute"].items()]
        console.print(_table(f"{data['tenant']}: per minute", rows, ["name", "limit", "remaining", "used"]))
        budgets = [
            {"period": data["today"]["date"], **data["today"]},
            {"period": data["month"]["month"], **data["month"]},
        ]
        console.print(
            _table("budgets", budgets, ["period", "total_tokens", "requests", "limit", "remaining"])
        )
        console.print(
            _table("history", data["history"], ["date", "input_tokens", "output_tokens", "requests"])
        )
        console.print(
            f"concurrent: {data['concurrent']['active']} of {data['concurrent']['limit'] or 'unlimited'}"
        )
    else:
        console.print(
            _table(command, [{"field": k, "value": v} for k, v in data.items()], ["field", "value"])
        )


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = _parser().parse_args(argv)
    console = console or Console()
    method, path, body = _request(args)
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    try:
        response = httpx.request(method, args.url.rstrip("/") + path, json=body, headers=headers, timeout=10)
    except httpx.HTTPError as e:
        print(f"error: cannot reach {args.url}: {e}", file=sys.stderr)
        return 2
    data = response.json() if response.content else {}
    if response.status_code >= 400:
        err = data.get("error", {}) if isinstance(data, dict) else {}
        print(
            f"error {response.status_code} ({err.get('code')}): {err.get('message', response.text)}",
            file=sys.stderr,
        )
        return 1
    if args.json:
        console.print_json(orjson.dumps(data).decode())
    else:
        _render(console, args, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
