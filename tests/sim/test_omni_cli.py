"""`python -m loadtest.sim --api sglang-omni` as a real child process; `--api sglang` stays the plain sim."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.processes import ROOT, Processes, child_env

pytestmark = pytest.mark.e2e


def test_api_switch_starts_the_omni_server_and_keeps_sglang_the_default(tmp_path: Path) -> None:
    with contextlib.closing(Processes(tmp_path)) as procs:
        check_both(procs)


def check_both(procs: Processes) -> None:
    omni = procs.sim("--api", "sglang-omni", "--omni-release", "later", "--time-scale", "50", name="omni")
    health = httpx.get(omni.url + "/health").json()
    assert health["stages"][-1] == "code2wav" and health["entry_stage"] == "preprocessing"
    r = httpx.post(
        omni.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    assert httpx.get(omni.url + "/get_server_info").status_code == 404
    plain = procs.sim("--time-scale", "50", name="plain")
    assert httpx.get(plain.url + "/get_server_info").status_code == 200
    assert httpx.get(plain.url + "/health").content == b""


def test_release_only_flags_are_refused() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "loadtest.sim", "--api", "sglang-omni", "--max-queued-requests", "4"],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "max_queued_requests exists only in later sglang-omni releases" in run.stdout
