"""The command line of `omnigate sim --api sglang-omni` (served by `loadtest/sim/cli.py`): flags to app."""

from __future__ import annotations

import argparse

from starlette.applications import Starlette

from loadtest.sim.faults import add_fault_flags, faults_from_args
from loadtest.sim.omni.config import OmniConfig
from loadtest.sim.omni.server import create_app


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="omnigate sim --api sglang-omni",
        description="Simulated sglang-omni server (Qwen3-Omni speech pipeline, no GPU).",
    )
    p.add_argument("--api", choices=["sglang-omni"], default="sglang-omni")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--profile", default="qwen3-omni", help="bundled omni profile name or path to a YAML file")
    p.add_argument("--model", default=None, help="name in /v1/models and answers (default: the profile's)")
    p.add_argument(
        "--omni-release",
        choices=["snapshot", "later"],
        default="snapshot",
        help="snapshot: sglang-omni 2489a10 (Apr 2026); later: main as indexed (400/503 errors, content "
        "parts, text-only requests skip the talker, caps 64/32, streams aborted on disconnect)",
    )
    p.add_argument("--text-only", action="store_true", help="the 6-stage pipeline: no talker, never audio")
    p.add_argument("--thinker-max-running-requests", type=int, help="default 16 (snapshot) / 64 (later)")
    p.add_argument("--talker-max-running-requests", type=int, help="default 16 (snapshot) / 32 (later)")
    p.add_argument(
        "--max-queued-requests", type=int, help="later release only: 503 beyond thinker cap + this"
    )
    p.add_argument(
        "--enable-metrics", action="store_true", help="GET /metrics with the sglang_omni_* families"
    )
    p.add_argument(
        "--speech-route",
        choices=["serve", "reject"],
        default="serve",
        help="reject: /v1/audio/speech fails as Qwen3-Omni's real pipeline does; serve: speak the input",
    )
    p.add_argument("--time-scale", type=float, default=1.0, help="virtual clock runs this many times faster")
    p.add_argument("--seed", type=int, default=0)
    add_fault_flags(p)
    return p


def app_from_args(args: argparse.Namespace) -> Starlette:
    config = OmniConfig(
        profile=args.profile,
        model=args.model,
        release=args.omni_release,
        text_only=args.text_only,
        thinker_max_running_requests=args.thinker_max_running_requests,
        talker_max_running_requests=args.talker_max_running_requests,
        max_queued_requests=args.max_queued_requests,
        enable_metrics=args.enable_metrics,
        speech_route=args.speech_route,
        time_scale=args.time_scale,
        seed=args.seed,
        faults=faults_from_args(args),
    )
    return create_app(config)
