"""`omnigate demo`: the pure parts (plan, view, summary) and two real runs as subprocesses.

The real runs check what a user relies on: requests succeed through the gateway with the demo keys, the
final summary line is printed, Ctrl-C and the duration both stop every child process, none is left.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from loadtest.records import RequestRecord
from omnigate.demo.plan import DemoError, build_plan, choose_port, default_config
from omnigate.demo.view import (
    BackendView,
    GatewayView,
    Objective,
    Snapshot,
    apply_admin_state,
    objectives,
    parse_gateway_metrics,
    plain_line,
    render,
    summary_line,
    verdict,
)

SUMMARY = re.compile(r"^demo summary: (.*)$", re.M)
PID_LINE = re.compile(r"^  started (\S+)\s+pid (\d+)", re.M)


ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = default_config()


class Ports:
    """Port numbers handed out in order, instead of free ones: planning stays pure."""

    def __init__(self, first: int = 31000) -> None:
        self.next = first

    def __call__(self) -> int:
        self.next += 1
        return self.next - 1


# -- plan -------------------------------------------------------------------------------------------------
def test_plan_gives_every_listed_backend_its_own_simulator_and_rewrites_the_config(tmp_path: Path) -> None:
    plan = build_plan(DEFAULT_CONFIG, 18080, 4.0, tmp_path, ports=Ports())
    assert [(s.name, s.pool, s.port) for s in plan.sims] == [
        ("interactive-0", "interactive", 31000),
        ("interactive-1", "interactive", 31001),
        ("offline-0", "offline", 31002),
        ("speech-0", "speech", 31003),
    ]
    pools = {p["name"]: p["backends"] for p in plan.gateway_doc["pools"]}
    assert pools == {
        "interactive": ["http://127.0.0.1:31000", "http://127.0.0.1:31001"],
        "offline": ["http://127.0.0.1:31002"],
        "speech": ["http://127.0.0.1:31003"],
    }
    assert plan.gateway_doc["listen"] == {"host": "127.0.0.1", "port": 18080}
    assert "demo" not in plan.gateway_doc
    assert plan.keys == {"sk-demo-alice": "alice", "sk-demo-bob": "bob", "sk-demo-batch": "batch"}
    assert plan.admin_token == "demo-admin-token"
    assert plan.base_url == "http://127.0.0.1:18080"
    interactive = plan.sims[0].args
    assert interactive[:2] == ("--time-scale", "4.0")
    assert interactive[-2:] == ("--model", "qwen2.5-omni-7b")
    assert "--enable-priority-scheduling" in interactive
    assert "--enable-priority-scheduling" not in plan.sims[2].args
    speech = plan.sims[3].args  # a simulated sglang-omni server serving the speech pool's own model
    assert speech[-2:] == ("--model", "qwen3-omni") and speech[2:4] == ("--api", "sglang-omni")


def test_the_shipped_policy_is_the_default_one_run_as_an_editable_copy(tmp_path: Path) -> None:
    plan = build_plan(DEFAULT_CONFIG, 18080, 1.0, tmp_path, ports=Ports())
    assert plan.policy_path == tmp_path / "policy.yaml"
    assert plan.policy_path.read_bytes() == (ROOT / "policies" / "default.yaml").read_bytes()
    own = tmp_path / "mine.yaml"
    own.write_text("version: 1\n")
    plan = build_plan(DEFAULT_CONFIG, 18080, 1.0, tmp_path, policy=own, ports=Ports())
    assert plan.policy_path == own


def test_a_relative_policy_path_is_read_beside_the_demo_config(tmp_path: Path) -> None:
    doc = yaml.safe_load(DEFAULT_CONFIG.read_text())
    doc["policy_path"] = "house-rules.yaml"
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "demo.yaml"
    path.write_text(yaml.safe_dump(doc))
    plan = build_plan(path, 18080, 1.0, tmp_path, ports=Ports())
    assert plan.policy_path == tmp_path / "conf" / "house-rules.yaml"


def _write_config(tmp_path: Path, edit: dict) -> Path:
    doc = yaml.safe_load(DEFAULT_CONFIG.read_text())
    doc["demo"].update(edit)
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(doc))
    (tmp_path / "policy.yaml").write_bytes((ROOT / "policies" / "default.yaml").read_bytes())
    return path


def test_plan_rejects_a_bad_demo_section_with_the_field_named(tmp_path: Path) -> None:
    with pytest.raises(DemoError, match=r"demo\.rate: Input should be greater than 0"):
        build_plan(_write_config(tmp_path, {"rate": 0}), 18080, 1.0, tmp_path, ports=Ports())


def test_plan_rejects_a_bad_gateway_config(tmp_path: Path) -> None:
    doc = yaml.safe_load(DEFAULT_CONFIG.read_text())
    doc["pools"][0]["models"] = []
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(DemoError, match=r"pools\.0\.models"):
        build_plan(path, 18080, 1.0, tmp_path, ports=Ports())


@pytest.mark.e2e
def test_an_explicit_port_in_use_is_an_error_and_zero_means_any() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(DemoError, match=f"port {taken} is in use"):
            choose_port(taken)
        assert choose_port(0) != taken


# -- view -------------------------------------------------------------------------------------------------
def _rec(cls: str, key: str, status: int = 200, error: str | None = None, done: bool = True) -> RequestRecord:
    return RequestRecord(
        traffic_class=cls,
        tenant=key,
        status=status,
        error=error,
        sent=1.0,
        ttft=0.1 if done and status == 200 else None,
        e2e=1.1 if done else None,
        output_tokens=11,
    )


RECORDS = [
    _rec("interactive", "k-a"),
    _rec("interactive", "k-a"),
    _rec("interactive", "k-b", status=429, error="requests_per_minute_exceeded"),
    _rec("offline", "k-c", status=502, error="backend_status"),
    _rec("offline", "k-c", done=False),
    _rec("offline", "k-c", error="unfinished"),
]


def test_summary_line_counts_every_outcome_once() -> None:
    assert summary_line(RECORDS, 2) == (
        "demo summary: sent=6 ok=2 rejected=1 failed=1 unfinished=2 skipped=2"
    )


GATEWAY_METRICS = """\
# TYPE omnigate_requests_total counter
omnigate_requests_total{pool="interactive",traffic_class="interactive",tenant="alice",bucket="text",\
priority="5",outcome="ok"} 7.0
omnigate_requests_total{pool="interactive",traffic_class="interactive",tenant="bob",bucket="text",\
priority="5",outcome="rejected"} 2.0
omnigate_requests_total{pool="offline",traffic_class="offline",tenant="batch",bucket="text",\
priority="0",outcome="upstream_error"} 1.0
# TYPE omnigate_rejections_total counter
omnigate_rejections_total{reason="queue_full",traffic_class="interactive"} 3.0
# TYPE omnigate_queue_depth gauge
omnigate_queue_depth{pool="interactive",priority="5"} 4.0
omnigate_queue_depth{pool="interactive",priority="10"} 1.0
"""


def test_gateway_metrics_are_reduced_per_pool_class_and_outcome() -> None:
    view = parse_gateway_metrics(GATEWAY_METRICS)
    assert view.up
    assert view.outcomes == Counter(
        {
            ("interactive", "interactive", "ok"): 7,
            ("interactive", "interactive", "rejected"): 2,
            ("offline", "offline", "upstream_error"): 1,
        }
    )
    assert view.rejections == Counter({"queue_full": 3})
    assert view.queue_depth == Counter({"interactive": 5})


def test_admin_state_fills_pool_and_backend_views_by_backend_id() -> None:
    gw = GatewayView(up=True)
    backends = [
        BackendView("interactive-0", "interactive", "http://127.0.0.1:1"),
        BackendView("x-0", "x", "u"),
    ]
    state = {
        "pools": {
            "interactive": {
                "queue_depth": 3,
                "in_flight": 9,
                "window_s": 0.02,
                "backends": [
                    {
                        "backend": "interactive-0",
                        "healthy": True,
                        "circuit": "closed",
                        "active": 9,
                        "limit": 24,
                    }
                ],
            }
        }
    }
    apply_admin_state(state, gw, backends)
    assert (gw.pools["interactive"].queue_depth, gw.pools["interactive"].in_flight) == (3, 9)
    assert gw.pools["interactive"].window_s == 0.02
    b = backends[0]
    assert (b.healthy, b.circuit, b.active, b.limit) == (True, "closed", 9, 24)
    assert backends[1].healthy is None


def _snapshot() -> Snapshot:
    gw = parse_gateway_metrics(GATEWAY_METRICS)
    backend = BackendView("interactive-0", "interactive", "http://127.0.0.1:30123", True, 0.425, 6, 2)
    keys = {"k-a": "alice", "k-b": "bob", "k-c": "batch"}
    goals = {"interactive": Objective(2000.0, 60.0), "offline": Objective(None, None)}
    return Snapshot(
        "http://127.0.0.1:8080", 4.0, "load", 10.0, RECORDS, 2, keys, goals, gateway=gw, backends=[backend]
    )


def test_plain_line_reports_totals_per_class_latency_queue_and_kv() -> None:
    line = plain_line(_snapshot())
    assert line.startswith("[demo     4 s load] sent=6 ok=2 rejected=1 failed=1 in_flight=2 req/s=0.5")
    assert "| interactive: ok=2 ttft_p99=100ms tpot_p99=100.0ms" in line
    assert "| offline: ok=0 ttft_p99=- tpot_p99=-" in line
    assert line.endswith("| gateway queued=5 rejected=3 | kv interactive-0=42%")


def test_live_view_fits_an_80_column_terminal_and_shows_each_part() -> None:
    console = Console(width=80, record=True)
    console.print(render(_snapshot()))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for needle in ("interactive", "alice", "bob", "batch", "100/100", "queue_full 3", "42.5 %", ":30123"):
        assert needle in text, needle
    assert "…" not in text  # nothing truncated


# -- real runs --------------------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def _pids(output: str) -> dict[str, int]:
    return {name: int(pid) for name, pid in PID_LINE.findall(output)}


def _summary(output: str) -> dict[str, int]:
    match = SUMMARY.search(output)
    assert match, output[-3000:]
    return {k: int(v) for k, v in (pair.split("=") for pair in match.group(1).split())}


def _demo(*args: str) -> list[str]:
    return [sys.executable, "-m", "omnigate.demo", "--port", "0", "--time-scale", "20", *args]


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_demo_runs_a_workload_for_its_duration_and_leaves_no_process_behind(tmp_path: Path) -> None:
    # A long drain so that a slow CI box finishes every request instead of cutting it (`unfinished`).
    config = _write_config(tmp_path, {"rate": 2.0, "drain_s": 30})
    proc = subprocess.run(
        _demo("--duration", "8", "--config", str(config), "--print-every", "2"),
        capture_output=True,
        text=True,
        timeout=110,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    pids = _pids(out)
    assert sorted(pids) == ["gateway", "interactive-0", "interactive-1", "offline-0", "speech-0"]
    summary = _summary(out)
    assert summary["ok"] >= 1
    assert summary["ok"] + summary["rejected"] == summary["sent"]  # 429s (bob's quota) are allowed
    assert (summary["failed"], summary["unfinished"], summary["skipped"]) == (0, 0, 0)
    assert "interactive: ok=" in out and "offline: ok=" in out
    assert "what the gateway kept (P99 against the policy's objectives) and refused:" in out
    assert re.search(r"^interactive: TTFT P99 \d+ ms ≤ 2000 ms ✓ · TPOT P99 [\d.]+ ms", out, re.M), out[
        -3000:
    ]
    assert "stopped 5 processes: " in out and "killed" not in out
    assert [name for name, pid in pids.items() if _alive(pid)] == []


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_ctrl_c_stops_an_unbounded_demo_that_openai_clients_used() -> None:
    from openai import AuthenticationError, OpenAI

    proc = subprocess.Popen(
        _demo("--duration", "0", "--no-load"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        banner = ""
        while "Try it from another terminal" not in banner:  # the pids come first
            line = proc.stdout.readline()
            assert line, f"demo exited before it was up: {banner}"
            banner += line
        pids = _pids(banner)
        assert len(pids) == 5
        base_url = re.search(r"omnigate demo is up: (\S+)", banner)
        assert base_url
        client = OpenAI(base_url=base_url.group(1), api_key="sk-demo-alice", max_retries=0, timeout=30)
        reply = client.chat.completions.create(
            model="qwen2.5-omni-7b",
            messages=[{"role": "user", "content": "Hello!"}],
            max_tokens=8,
            extra_headers={"x-omnigate-class": "interactive"},
        )
        assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 8
        assert reply.choices[0].message.content
        with client.audio.speech.with_streaming_response.create(  # the speech pool (0.1.9), streamed as PCM
            model="qwen3-omni",
            voice="default",
            input="Hello from the demo.",
            response_format="pcm",
            extra_body={"stream": True},
        ) as spoken:
            assert spoken.headers["content-type"] == "audio/pcm"
            assert spoken.headers["x-sample-rate"] == "24000"
            pcm = spoken.read()
        assert pcm and len(pcm) % 2 == 0
        stranger = OpenAI(base_url=base_url.group(1), api_key="not-a-demo-key", max_retries=0, timeout=30)
        with pytest.raises(AuthenticationError):
            stranger.chat.completions.create(
                model="qwen2.5-omni-7b", messages=[{"role": "user", "content": "?"}]
            )
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, rest[-3000:]
    assert _summary(rest) == {"sent": 0, "ok": 0, "rejected": 0, "failed": 0, "unfinished": 0, "skipped": 0}
    assert "stopped 5 processes: " in rest and "killed" not in rest
    assert [name for name, pid in pids.items() if _alive(pid)] == []


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_a_backend_that_fails_to_start_is_reported_and_the_others_are_stopped(tmp_path: Path) -> None:
    config = _write_config(tmp_path, {"sim_args": {"offline": ["--bogus-flag"]}})
    proc = subprocess.run(
        _demo("--duration", "5", "--config", str(config)),
        capture_output=True,
        text=True,
        timeout=110,
        cwd=ROOT,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "omnigate demo: offline-0 exited with code 2:" in proc.stderr
    assert "unrecognized arguments: --bogus-flag" in proc.stderr
    pids = _pids(proc.stdout)
    # the gateway never started
    assert sorted(pids) == ["interactive-0", "interactive-1", "offline-0", "speech-0"]
    assert "stopped 4 processes: " in proc.stdout
    assert [name for name, pid in pids.items() if _alive(pid)] == []


def test_the_live_view_shows_time_to_first_audio_and_the_real_time_factor() -> None:
    snap = _snapshot()
    spoke = RequestRecord(tenant="k-a", traffic_class="interactive", status=200, sent=0.5, e2e=3.0, ttft=0.4)
    spoke.ttfa, spoke.audio = 0.9, [(0.9, 0.8), (1.5, 0.8), (2.1, 0.8)]  # 1.2 s for 1.6 s: RTF 0.75
    snap.records = [*snap.records, spoke]
    console = Console(width=80, record=True)
    console.print(render(snap))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    row = next(line for line in text.splitlines() if line.strip().startswith("alice") and "900" in line)
    assert row.split()[1:] == ["1", "900/900", "0.75/0.75", "-", "2"]  # no text in this answer
    assert "ttfa_p99=900ms rtf_p99=0.75" in plain_line(snap)
    verdict_text = " ".join(text.split())  # its lines wrap at 80 columns
    assert (
        "interactive, answers that speak: RTF P99 0.75 ≤ 1 ✓ · TTFA P99 900 ms (no objective)" in verdict_text
    )
    plain = Console(width=80, record=True)
    plain.print(render(_snapshot()))
    assert "speech:" not in plain.export_text()  # no answer spoke: no speech table


# -- the verdict: what the gateway kept and what it refused ---------------------------------------------
def _answer(bucket: str, tpot_ms: float, key: str = "k-a", spoke: bool = False) -> RequestRecord:
    """An interactive answer of 11 tokens, 0.1 s to the first, `tpot_ms` apart after it."""
    step = tpot_ms / 1000
    r = RequestRecord(bucket=bucket, traffic_class="interactive", tenant=key, status=200, sent=0.0, ttft=0.1)
    r.chunk_times = [0.1 + step * k for k in range(11)]
    r.e2e, r.output_tokens = r.chunk_times[-1], 11
    if spoke:  # 1.2 s from the first chunk to the last for the 1.6 s before it: RTF 0.75
        r.ttfa, r.audio = 0.3, [(0.3, 0.8), (0.9, 0.8), (1.5, 0.8)]
    return r


def _view(records: list[RequestRecord]) -> str:
    snap = _snapshot()
    snap.records = records
    console = Console(width=80, record=True)
    console.print(render(snap))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    return " ".join(text.split())  # the verdict's lines wrap at 80 columns


def test_text_tpot_leaves_out_answers_that_speak_and_the_speech_table_shows_their_pace() -> None:
    records = [_answer("text", 10.0) for _ in range(5)] + [_answer("audio_out", 80.0, spoke=True)]
    text = _view(records)
    assert "interactive: TTFT P99 100 ms ≤ 2000 ms ✓ · TPOT P99 10.0 ms ≤ 60 ms ✓ · 5 answers in text" in text
    assert "interactive, answers that speak: RTF P99 0.75 ≤ 1 ✓ · TTFA P99 300 ms" in text
    assert "their text follows the voice, judged by RTF, not TPOT" in text
    assert "interactive 6 6 0 0 0" in text and "10.0/10.0" in text  # the class row: text TPOT only
    assert "alice 1 300/300 0.75/0.75 80/80 2" in text  # speech table: its text at the voice's 80 ms


def test_a_missed_objective_is_named_with_the_bucket_whose_tail_it_is() -> None:
    records = [_answer("text", 10.0) for _ in range(5)] + [_answer("multi_image", 75.0) for _ in range(3)]
    text = _view(records)
    assert "TPOT P99 75.0 ms > 60 ms ✗ MISSED" in text
    assert "TPOT tail: multi_image answers, P99 75 ms" in text


def test_refusals_are_split_into_capacity_and_tenant_quota_with_tenant_ids() -> None:
    refused = [
        _rec("interactive", "k-b", status=429, error="requests_per_minute_exceeded"),
        _rec("interactive", "k-b", status=429, error="requests_per_minute_exceeded"),
        _rec("interactive", "k-a", status=503, error="queue_full"),
    ]
    text = _view([_answer("text", 10.0), *refused])
    assert (
        "refused 3 · to keep the objectives (capacity): 1 (alice queue_full ×1) · by tenant quota or "
        "budget: 2 (bob requests_per_minute_exceeded ×2)"
    ) in text
    assert "k-a" not in text and "k-b" not in text  # tenants by id, never by key
    plain = "\n".join(line.plain for line in verdict(_snapshot()))
    assert plain.startswith("what the gateway kept (P99 against the policy's objectives) and refused:")


def test_the_objectives_are_the_running_policys() -> None:
    from gateway.livepolicy.policy import load_policy

    goals = objectives(load_policy(ROOT / "policies" / "default.yaml"))
    assert goals == {"interactive": Objective(2000.0, 60.0), "offline": Objective(None, None)}
