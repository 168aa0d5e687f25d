"""Short runs of the ledger chaos benchmark and the soak benchmark (bench/ledger.py, bench/soak.py): real
gateway, simulated engines, redis-server and SQLite processes, with their targets checked (`--check`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, *args: str, timeout: float) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, *args, "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def test_ledger_matches_the_engines_through_chaos() -> None:
    """Clients leaving at random points, engine faults, Redis stopped and restarted, SQLite locked: all
    tenants' tokens together within 5 % of the engines' own count, no tenant counted more requests than it
    sent, nothing counted twice, every counter zero. A 15 s run has ~180 requests per tenant, too few to
    hold each tenant alone (one run read 1.052 for one tenant and 0.999 for another, a 2.7 % excess in
    all); the benchmark's full runs judge each tenant at 2 %."""
    _run("bench.ledger", "--duration", "15", "--tolerance", "0.05", "--overall", timeout=600)


def test_a_short_soak_stays_flat() -> None:
    _run("bench.soak", "--duration", "30", "--sample", "2", timeout=300)
