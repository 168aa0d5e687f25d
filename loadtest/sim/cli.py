"""`python -m loadtest.sim` / `omnigate sim`: run one simulated SGLang (Omni) backend under uvicorn."""

from __future__ import annotations

import argparse

import uvicorn
from starlette.applications import Starlette

from loadtest.sim.config import SimConfig
from loadtest.sim.engine import MODELLED_POLICIES, SCHEDULE_POLICY_CHOICES
from loadtest.sim.faults import add_fault_flags, faults_from_args
from loadtest.sim.omni import cli as omni_cli
from loadtest.sim.server import create_app

API_CHOICES = ("sglang", "sglang-omni")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omnigate sim", description="Simulated SGLang Omni backend (no GPU).")
    p.add_argument(
        "--api", choices=API_CHOICES, default="sglang", help="sglang-omni: see `--api sglang-omni --help`"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--profile", default="default", help="bundled profile name or path to a YAML profile")
    p.add_argument("--model", default=None, help="served model name (default: the profile's)")
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--max-prefill-tokens", type=int)
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--mem-fraction-static", type=float, help="default: SGLang's rule for the profile's GPU")
    p.add_argument(
        "--schedule-policy",
        choices=SCHEDULE_POLICY_CHOICES,
        default="fcfs",
        help=f"SGLang's choices; modelled: {', '.join(MODELLED_POLICIES)}",
    )
    p.add_argument("--enable-priority-scheduling", action="store_true", help="larger `priority` first")
    p.add_argument("--schedule-low-priority-values-first", action="store_true")
    p.add_argument("--priority-scheduling-preemption-threshold", type=int, default=10)
    p.add_argument("--schedule-conservativeness", type=float, default=1.0)
    p.add_argument("--max-queued-requests", type=int)
    p.add_argument("--time-scale", type=float, default=1.0, help="virtual clock runs this many times faster")
    p.add_argument("--oom-mode", choices=["retract", "crash"], default="retract")
    p.add_argument("--restart-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--radix-cache",
        action="store_true",
        help="model SGLang's prefix cache (its default; without this flag the sim runs as SGLang with "
        "--disable-radix-cache)",
    )
    p.add_argument(
        "--enable-cache-report",
        action="store_true",
        help="usage carries prompt_tokens_details.cached_tokens, as SGLang's flag of that name",
    )
    p.add_argument(
        "--sglang-version",
        choices=["0.5.23", "0.5.9"],
        default="0.5.23",
        help="the SGLang release whose HTTP surface to serve (chunk shapes, stream headers, /v1/loads)",
    )
    add_fault_flags(p)
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    faults = faults_from_args(args)
    return SimConfig(
        profile=args.profile,
        model=args.model,
        max_running_requests=args.max_running_requests,
        max_total_tokens=args.max_total_tokens,
        max_prefill_tokens=args.max_prefill_tokens,
        chunked_prefill_size=args.chunked_prefill_size,
        mem_fraction_static=args.mem_fraction_static,
        schedule_policy=args.schedule_policy,
        enable_priority_scheduling=args.enable_priority_scheduling,
        schedule_low_priority_values_first=args.schedule_low_priority_values_first,
        priority_scheduling_preemption_threshold=args.priority_scheduling_preemption_threshold,
        schedule_conservativeness=args.schedule_conservativeness,
        max_queued_requests=args.max_queued_requests,
        time_scale=args.time_scale,
        oom_mode=args.oom_mode,
        restart_s=args.restart_s,
        seed=args.seed,
        radix_cache=args.radix_cache,
        enable_cache_report=args.enable_cache_report,
        faults=faults,
        sglang_version=args.sglang_version,
    )


def app_from_args(args: argparse.Namespace) -> Starlette:
    return create_app(config_from_args(args))


def main(argv: list[str] | None = None) -> int:
    api = argparse.ArgumentParser(add_help=False)
    api.add_argument("--api", choices=API_CHOICES, default="sglang")
    omni = api.parse_known_args(argv)[0].api == "sglang-omni"
    parser = omni_cli.build_parser() if omni else build_parser()
    args = parser.parse_args(argv)
    try:
        app = omni_cli.app_from_args(args) if omni else app_from_args(args)
    except ValueError as exc:  # pydantic ValidationError and unknown profiles are ValueErrors
        print(f"omnigate sim: {exc}")
        return 2
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2)
    return 0
