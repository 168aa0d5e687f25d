"""The product's own commands, `omnigate serve` and `omnigate policy check|schema` (omnigate/cli.py dispatches
every `omnigate` command; this module's parser takes the command name itself)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import orjson

from gateway.livepolicy.policy import Policy, PolicyError, diff_policies, load_policy, policy_schema
from gateway.livepolicy.refs import check_refs
from gateway.settings.config import ConfigError, load_config


def _setup_logging(level: str) -> None:
    """A plain handler written from the event loop (a queue and listener thread costs more: docs/decisions/
    0004-plain-log-handler.md). httpx's INFO line per request (admin and alert clients) stays out."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    # Access lines are JSON documents of their own: one per line on stdout, nothing around them.
    access = logging.getLogger("omnigate.access")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access.addHandler(handler)
    access.propagate = False


def cmd_serve(args: argparse.Namespace) -> int:
    from gateway.process.workers import refusal, reuse_port_socket, supervise

    _setup_logging(args.log_level)
    try:
        config = load_config(args.config)
        listen = config.listen.model_copy(
            update={
                "host": args.host or config.listen.host,
                "port": config.listen.port if args.port is None else args.port,
            }
        )
        config = config.model_copy(update={"listen": listen})
        refused = refusal(config, args.workers, listen.port)
        if refused is not None:
            print(f"omnigate: {refused}", file=sys.stderr)
            return 2
        if args.workers > 1:
            argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", args.config, "--reuse-port"]
            argv += ["--host", listen.host, "--port", str(listen.port), "--log-level", args.log_level]
            return supervise(argv, args.workers)
        from gateway.http.app import create_app  # not in the supervisor: its workers import it
        from gateway.http.server import serve

        app = create_app(config)
    except (ConfigError, PolicyError) as e:
        print(f"omnigate: {e}", file=sys.stderr)
        return 2
    gateway = app.state.gateway
    sock = reuse_port_socket(listen.host, listen.port) if args.reuse_port else None
    serve(app, listen.host, listen.port, config.limits, gateway.drain, config.shutdown.drain_s, sock)
    return 0


def _running_policy(url: str, token: str | None) -> dict | None:
    import httpx

    try:
        resp = httpx.get(
            url.rstrip("/") + "/admin/policy",
            timeout=3.0,
            trust_env=False,
            headers={"authorization": f"Bearer {token}"} if token else {},
        )
    except httpx.HTTPError as e:
        print(f"(could not reach {url}: {type(e).__name__}; diffing against the default policy)")
        return None
    if resp.status_code != 200:
        print(f"(running policy unavailable: HTTP {resp.status_code}; diffing against the default policy)")
        return None
    data = orjson.loads(resp.content)
    return data.get("policy") if isinstance(data, dict) else None


def cmd_policy_check(args: argparse.Namespace) -> int:
    try:
        new = load_policy(args.file)
        if args.config:
            check_refs(new, {p.name: p.models for p in load_config(args.config).pools}, args.file)
    except (PolicyError, ConfigError) as e:
        print(f"INVALID {e}")
        return 1
    base: Policy | dict = Policy()
    label = "default policy"
    if args.url:
        running = _running_policy(args.url, args.token or os.environ.get("OMNIGATE_ADMIN_TOKEN"))
        if running is not None:
            base, label = running, f"running policy at {args.url}"
    changes = diff_policies(base, new)
    print(f"OK {args.file} is valid.")
    if changes:
        print(f"Changes against the {label}:")
        for line in changes:
            print(f"  {line}")
    else:
        print(f"No changes against the {label}.")
    return 0


def cmd_policy_schema(args: argparse.Namespace) -> int:
    text = orjson.dumps(policy_schema(), option=orjson.OPT_INDENT_2).decode()
    if args.output:
        Path(args.output).write_text(text + "\n")
    else:
        print(text)
    return 0


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnigate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", default="config/gateway.yaml")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="processes on the one port (SO_REUSEPORT), each a replica; above 1 needs a Redis store",
    )
    serve.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # one of the workers
    serve.set_defaults(func=cmd_serve)

    policy = sub.add_parser("policy", help="validate or export policy files")
    psub = policy.add_subparsers(dest="policy_command", required=True)
    check = psub.add_parser("check", help="validate FILE and diff it against the running or default policy")
    check.add_argument("file")
    check.add_argument("--config", help="gateway config: check the pools and models the policy names")
    check.add_argument("--url", help="gateway base URL to diff against its running policy")
    check.add_argument("--token", help="admin token (default: $OMNIGATE_ADMIN_TOKEN)")
    check.set_defaults(func=cmd_policy_check)
    schema = psub.add_parser("schema", help="print the policy JSON Schema")
    schema.add_argument("--output", "-o")
    schema.set_defaults(func=cmd_policy_schema)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
