"""`python -m loadtest.sim` / `omnigate sim`: run one simulated SGLang (Omni) backend under uvicorn."""

from __future__ import annotations

import argparse

import uvicorn

from loadtest.sim.config import SimConfig
from loadtest.sim.faults import FaultConfig
from loadtest.sim.server import create_app


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omnigate sim", description="Simulated SGLang Omni backend (no GPU).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--profile", default="default", help="bundled profile name or path to a YAML profile")
    p.add_argument("--model", default=None, help="served model name (default: the profile's)")
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--max-prefill-tokens", type=int)
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--schedule-policy", choices=["fcfs", "priority"], default="fcfs")
    p.add_argument("--schedule-conservativeness", type=float, default=1.0)
    p.add_argument("--max-queued-requests", type=int)
    p.add_argument("--time-scale", type=float, default=1.0, help="virtual clock runs this many times faster")
    p.add_argument("--oom-mode", choices=["retract", "crash"], default="retract")
    p.add_argument("--restart-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    f = p.add_argument_group("fault injection (durations in virtual seconds)")
    for name, field in FaultConfig.model_fields.items():
        flag = "--fault-" + name.replace("_", "-")
        if field.annotation is bool:
            f.add_argument(flag, action="store_true", help=field.description)
        else:
            kind = int if field.annotation is int else float
            f.add_argument(flag, type=kind, default=field.default, help=field.description)
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    faults = FaultConfig(**{name: getattr(args, "fault_" + name) for name in FaultConfig.model_fields})
    return SimConfig(
        profile=args.profile,
        model=args.model,
        max_running_requests=args.max_running_requests,
        max_total_tokens=args.max_total_tokens,
        max_prefill_tokens=args.max_prefill_tokens,
        chunked_prefill_size=args.chunked_prefill_size,
        schedule_policy=args.schedule_policy,
        schedule_conservativeness=args.schedule_conservativeness,
        max_queued_requests=args.max_queued_requests,
        time_scale=args.time_scale,
        oom_mode=args.oom_mode,
        restart_s=args.restart_s,
        seed=args.seed,
        faults=faults,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
        app = create_app(config)
    except ValueError as exc:  # pydantic ValidationError and unknown profiles are ValueErrors
        print(f"omnigate sim: {exc}")
        return 2
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2)
    return 0
