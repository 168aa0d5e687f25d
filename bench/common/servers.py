"""The processes the overhead benchmark measures: a zero-latency SGLang-like backend, omnigate, nginx,
LiteLLM and smg.

Each runs in its own session (so Ctrl-C reaches only the benchmark, which then stops them in order) and
with PR_SET_PDEATHSIG (so they die with the benchmark even if it is killed hard). `Procs` owns them all.

Run alone, `python -m bench.common.servers backend` serves the backend on a free loopback port and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import orjson

from loadtest.ports import free_port

MODEL = "bench-model"
STREAM_CHUNKS = 100
ROOT = Path(__file__).resolve().parents[2]


# -- the backend ---------------------------------------------------------------------------------------
def _chunk_event(index: int, delta: dict[str, object], finish: str | None) -> bytes:
    """One chat.completion.chunk in SGLang's shape."""
    obj = {
        "id": "bench-0",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}
        ],
        "usage": None,
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_USAGE = {"prompt_tokens": 12, "completion_tokens": STREAM_CHUNKS, "total_tokens": 12 + STREAM_CHUNKS}
_EVENTS = [
    _chunk_event(
        i,
        {"role": "assistant", "content": "tok "} if i == 0 else {"role": None, "content": "tok "},
        "length" if i == STREAM_CHUNKS - 1 else None,
    )
    for i in range(STREAM_CHUNKS)
]
_USAGE_EVENT = (
    b"data: "
    + orjson.dumps(
        {
            "id": "bench-0",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": MODEL,
            "choices": [],
            "usage": _USAGE,
        }
    )
    + b"\n\n"
)
_DONE = b"data: [DONE]\n\n"
_WHOLE = orjson.dumps(
    {
        "id": "bench-0",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "tok " * STREAM_CHUNKS},
                "logprobs": None,
                "finish_reason": "length",
                "matched_stop": None,
            }
        ],
        "usage": _USAGE,
    }
)
_METRICS = (
    b"# HELP sglang:num_running_reqs The number of running requests.\n"
    b"# TYPE sglang:num_running_reqs gauge\n"
    b'sglang:num_running_reqs{model_name="bench-model"} 0.0\n'
    b"# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
    b"# TYPE sglang:num_queue_reqs gauge\n"
    b'sglang:num_queue_reqs{model_name="bench-model"} 0.0\n'
    b"# HELP sglang:token_usage The token usage.\n"
    b"# TYPE sglang:token_usage gauge\n"
    b'sglang:token_usage{model_name="bench-model"} 0.0\n'
)
_SERVER_INFO = orjson.dumps({"max_total_num_tokens": 1_000_000, "max_running_requests": 1024})
# SGLang's model list: smg finds a worker's models here before it routes to it
_MODEL_CARD = {"id": MODEL, "object": "model", "created": 1700000000, "owned_by": "sglang"}
_MODELS = orjson.dumps({"object": "list", "data": [_MODEL_CARD]})

# Streaming events a client gets: with and without the usage chunk; each event is its own HTTP chunk.
STREAM_BODY = b"".join(_EVENTS) + _DONE
STREAM_BODY_USAGE = b"".join(_EVENTS) + _USAGE_EVENT + _DONE
WHOLE_BODY = _WHOLE
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)
_CHUNKS = [_http_chunk(e) for e in _EVENTS]
_CHUNKS_TAIL = [_http_chunk(_DONE) + b"0\r\n\r\n"]
_CHUNKS_USAGE_TAIL = [_http_chunk(_USAGE_EVENT), *_CHUNKS_TAIL]


def _fixed(status: bytes, ctype: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        ctype,
        len(body),
        body,
    )


_RESP_WHOLE = _fixed(b"200 OK", b"application/json", _WHOLE)
_RESP_HEALTH = _fixed(b"200 OK", b"text/plain", b"")
_RESP_METRICS = _fixed(b"200 OK", b"text/plain; version=0.0.4", _METRICS)
_RESP_INFO = _fixed(b"200 OK", b"application/json", _SERVER_INFO)
_RESP_MODELS = _fixed(b"200 OK", b"application/json", _MODELS)
_RESP_404 = _fixed(b"404 Not Found", b"application/json", b'{"detail":"Not Found"}')
_RESP_400 = _fixed(b"400 Bad Request", b"application/json", b'{"detail":"bad request"}')


class _Backend(asyncio.Protocol):
    """HTTP/1.1 keep-alive with precomputed answers: as little CPU per request as Python allows."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            length = 0
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : stop if stop > 0 else None])
            total = end + 4 + length
            if len(self.buf) < total:
                return
            body = bytes(self.buf[end + 4 : total])
            del self.buf[:total]
            self._answer(head.split(b" ", 2), body)

    def _answer(self, line: list[bytes], body: bytes) -> None:
        assert self.transport is not None
        write = self.transport.write
        method, path = line[0], line[1] if len(line) > 1 else b""
        if method == b"post" and path == b"/v1/chat/completions":
            try:
                req = orjson.loads(body)
            except orjson.JSONDecodeError:
                write(_RESP_400)
                return
            if not req.get("stream"):
                write(_RESP_WHOLE)
                return
            usage = bool((req.get("stream_options") or {}).get("include_usage"))
            write(_STREAM_HEAD)
            for chunk in _CHUNKS:  # one write per event, as a token-by-token server sends them
                write(chunk)
            for chunk in _CHUNKS_USAGE_TAIL if usage else _CHUNKS_TAIL:
                write(chunk)
        elif method == b"get" and path == b"/health":
            write(_RESP_HEALTH)
        elif method == b"get" and path == b"/metrics":
            write(_RESP_METRICS)
        elif method == b"get" and path == b"/get_server_info":
            write(_RESP_INFO)
        elif method == b"get" and path == b"/v1/models":
            write(_RESP_MODELS)
        else:
            write(_RESP_404)


def _use_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def serve_backend(port: int) -> None:
    """Serve until SIGTERM; prints `PORT <n>` once listening."""
    _use_uvloop()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Backend, "127.0.0.1", port, backlog=1024)
        print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        await stop.wait()
        server.close()

    asyncio.run(main())


# -- process management -----------------------------------------------------------------------------------


def die_with_parent() -> None:
    """In a child (before exec): get SIGTERM when the benchmark dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its live children (nginx's worker), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


class Procs:
    """The benchmark's child processes; `close()` stops every one (SIGTERM, then SIGKILL)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        capture_stdout: bool = False,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE if capture_stdout else log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
            cwd=self.workdir,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        log.close()
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def wait_http(
    port: int, path: str, timeout: float, alive: Procs, name: str, expect: bytes | None = None
) -> None:
    """Poll GET `path` on loopback until it answers 200 (with `expect` in its answer, when given), the
    process dies, or `timeout` passes."""
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    deadline = time.monotonic() + timeout
    while True:
        alive.check_alive(name)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(request)
                answer = s.recv(64)
                while expect is not None and (chunk := s.recv(65536)):
                    answer += chunk
                if answer.startswith(b"HTTP/1.1 200") and (expect is None or expect in answer):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{name} did not answer GET {path} within {timeout:g} s:\n{alive.log_tail(name)}"
            )
        time.sleep(0.1)


def start_backend(procs: Procs) -> int:
    proc = procs.start("backend", [sys.executable, __file__, "backend"], capture_stdout=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("PORT "):
        procs.check_alive("backend")
        raise RuntimeError(f"backend did not report its port: {line!r}")
    return int(line.split()[1])


# Admission stages stay in the path but never hold or shed a request: no accumulating window, a fixed
# concurrency limit above any benchmark load, no deadline shedding. What is left is the proxy's own cost.
PASS_THROUGH_POLICY = """\
version: 1
window: {accumulate: {}}
controller: {algorithm: fixed, initial: 4096, min: 4, max: 4096}
queue:
  classes:
    interactive: {shed_by_deadline: false, max_queue_depth: 100000}
"""


def start_omnigate(
    procs: Procs,
    name: str,
    backend_port: int,
    *,
    access_log: bool,
    policy: str = PASS_THROUGH_POLICY,
    src: Path | None = None,
    limits: dict[str, Any] | None = None,
    tenant_key: str | None = None,
    redis_url: str | None = None,
    workers: int = 1,
    tracing: dict[str, Any] | None = None,
) -> int:
    """Generate a one-pool config + policy in the work dir and run `omnigate serve` on it.

    Without the access log the process also runs at log level warning, so nothing is logged per request.
    `src`: run the `gateway` package of that source tree instead (e.g. an older commit, for before/after).
    `limits`: the config's `limits` section (edge limits, body size); the defaults when None.
    `tenant_key`: require API keys and create one tenant with this key (None: auth off).
    `redis_url`: the Redis store (tenants, quotas, the engines' budgets shared); None: the memory store.
    `workers`: `serve --workers N` (N > 1 needs `redis_url`).
    `tracing`: the config's `tracing` section (off when None).
    """
    port = free_port()
    policy_path = procs.workdir / f"{name}-policy.yaml"
    policy_path.write_text(policy)
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "policy_path": str(policy_path),
        "watch_policy": False,
        "admin": {"token": "bench-admin-token"},
        "auth": {"required": tenant_key is not None},
        "store": {"kind": "memory"}
        if redis_url is None
        else {"kind": "redis", "redis_url": redis_url, "redis_prefix": f"{name}:"},
        "tenants": [] if tenant_key is None else [{"id": "bench-tenant", "keys": [tenant_key]}],
        "access_log": access_log,
        "pools": [
            {"name": "interactive", "models": [MODEL], "backends": [f"http://127.0.0.1:{backend_port}"]}
        ],
        "limits": limits or {},
        "tracing": tracing or {},
    }
    path = procs.workdir / f"{name}.yaml"
    path.write_bytes(orjson.dumps(config))  # JSON is YAML
    exe = ROOT / ".venv" / "bin" / "omnigate"
    argv = [str(exe)] if exe.exists() and src is None else [sys.executable, "-m", "gateway.cli"]
    env = {"PYTHONPATH": str(src.resolve())} if src is not None else None
    level = "info" if access_log else "warning"
    serve = [*argv, "serve", "--config", str(path), "--log-level", level, "--workers", str(workers)]
    procs.start(name, serve, env=env)
    wait_http(port, "/readyz", 60, procs, name)
    if workers > 1:
        wait_replicas(port, workers, 60, procs, name)
    return port


def wait_replicas(port: int, workers: int, timeout: float, alive: Procs, name: str) -> None:
    """Until /admin/state shows `workers` live replicas on the shared budget: every worker is serving."""
    request = (
        b"GET /admin/state HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer bench-admin-token\r\n"
        b"Connection: close\r\n\r\n"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive.check_alive(name)
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(request)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
            if b'"live_replicas":%d' % workers in answer.replace(b" ", b""):
                return
        time.sleep(0.2)
    raise RuntimeError(
        f"{name}: {workers} workers not all live within {timeout:g} s:\n{alive.log_tail(name)}"
    )


def start_redis(procs: Procs) -> str | None:
    """A private redis-server on a free loopback port (no persistence); None when it is not installed."""
    exe = shutil.which("redis-server")
    if exe is None:
        return None
    port = free_port()
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    procs.start("redis", [*argv, "--dir", str(procs.workdir)])
    deadline = time.monotonic() + 20
    while True:
        procs.check_alive("redis")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return f"redis://127.0.0.1:{port}/0"
        if time.monotonic() > deadline:
            raise RuntimeError(f"redis-server did not answer PING:\n{procs.log_tail('redis')}")
        time.sleep(0.1)


LITELLM_CONF = """\
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: http://127.0.0.1:{backend}/v1
      api_key: bench-unused
litellm_settings:
  telemetry: false
  drop_params: true
general_settings:
  master_key: {key}
"""
LITELLM_KEY = "sk-bench-" + "7f3a9c2e5b8d1f64" * 4
"""The proxy's master key (it refuses to start without one); like omnigate's rows, every request has a key."""

# LiteLLM reads its model price map from the network at import unless told to use the bundled copy.
LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "HF_HUB_OFFLINE": "1",
    "NO_PROXY": "127.0.0.1,localhost",
}


def tool_exe(name: str, given: str | None) -> str | None:
    """A compared proxy's CLI (`litellm`: `pip install -e '.[litellm]'`; `smg`, a Rust router in a Python
    wheel: `python3 -m venv /tmp/smg && /tmp/smg/bin/pip install smg`): `given`, else beside this
    interpreter, else on PATH; None when none is found."""
    if given:
        return given
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def start_litellm(procs: Procs, backend_port: int, exe: str) -> int:
    """LiteLLM's proxy (one worker, no database, `LITELLM_KEY` as its master key) routing `bench-model` to
    the backend as an OpenAI-compatible server."""
    port = free_port()
    conf = procs.workdir / "litellm.yaml"
    conf.write_text(LITELLM_CONF.format(model=MODEL, backend=backend_port, key=LITELLM_KEY))
    argv = [exe, "--config", str(conf), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    procs.start("litellm", argv, env=LITELLM_ENV)
    wait_http(port, "/health/liveliness", 120, procs, "litellm")
    return port


def start_smg(procs: Procs, backend_port: int, exe: str) -> int:
    """`smg launch` routing to the backend as its one worker (HTTP mode: it finds the model on the
    worker's /v1/models), its metrics listener on a private loopback port, logging warnings only."""
    port = free_port()
    argv = [
        exe,
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
        "--worker-urls",
        f"http://127.0.0.1:{backend_port}",
        "--log-level",
        "warn",
    ]
    procs.start("smg", argv, env={"NO_PROXY": "127.0.0.1,localhost"})
    wait_http(port, "/v1/models", 60, procs, "smg", expect=MODEL.encode())  # the worker is routable
    return port


NGINX_CONF = """\
worker_processes 1;
daemon off;
master_process on;
{user}pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/nginx-body;
    proxy_temp_path {dir}/nginx-proxy;
    fastcgi_temp_path {dir}/nginx-fastcgi;
    uwsgi_temp_path {dir}/nginx-uwsgi;
    scgi_temp_path {dir}/nginx-scgi;
    upstream backend {{
        server 127.0.0.1:{backend};
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=1024;
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def start_nginx(procs: Procs, backend_port: int) -> int | None:
    """Run nginx with a generated config; None when nginx is not installed."""
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if exe is None:
        return None
    port = free_port()
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = procs.workdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(user=user, dir=procs.workdir, backend=backend_port, port=port))
    procs.start(
        "nginx", [exe, "-p", str(procs.workdir), "-c", str(conf), "-e", str(procs.workdir / "nginx.err")]
    )
    wait_http(port, "/health", 20, procs, "nginx")
    return port


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="zero-latency SGLang-like backend for bench/overhead.py")
    parser.add_argument("role", choices=["backend"])
    parser.add_argument("--port", type=int, default=0)
    serve_backend(parser.parse_args().port)
