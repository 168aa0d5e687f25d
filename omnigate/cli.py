"""`omnigate COMMAND …`: a thin dispatcher to the product's and the harness's own command lines.

Each command's module is imported only when it runs, so `omnigate serve` never loads the harness, and
every command parses its own arguments (everything after its name).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Command:
    module: str  # has `main(argv) -> int`
    help: str
    named: bool = False  # the module's parser takes the command name itself (one parser, several commands)


PRODUCT = {
    "serve": Command("gateway.cli", "run the gateway", named=True),
    "policy": Command("gateway.cli", "validate or export policy files", named=True),
    "tenants": Command("gateway.tenants.cli", "manage tenants, keys and usage via the admin API"),
    "alerts": Command("gateway.observability.cli", "alerting tools: test"),
    "top": Command("gateway.top.cli", "a live terminal view of a running gateway"),
}
HARNESS = {
    "demo": Command("omnigate.demo.run", "simulated backends + gateway + a workload, with a live view"),
    "sim": Command("loadtest.sim.cli", "run a simulated SGLang (Omni) backend"),
    "loadtest": Command("loadtest.cli", "the validation harness: run | sweep | compare | validate-seed"),
}
COMMANDS = {**PRODUCT, **HARNESS}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omnigate",
        description="Admission-control gateway for multimodal LLM serving, and its validation harness.",
        epilog="Run `omnigate COMMAND -h` for a command's own options.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.help, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints usage (or -h) and exits
        return 2
    command = COMMANDS[argv[0]]
    rest = argv if command.named else argv[1:]
    return int(importlib.import_module(command.module).main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
