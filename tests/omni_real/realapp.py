"""sglang-omni 0.1.9's own HTTP app for the tests: a venv prepared and cached once, and the app run in it.

The venv holds the wheel (`--no-deps`: its torch / CUDA requirements are not needed by the HTTP layer) and
what its serve and client modules import. It lives under `$OMNIGATE_ENGINE_CACHE` (default
`~/.cache/omnigate`) as `sglang-omni-0.1.9/`, is built once (pip's own cache makes a rebuild offline) and is
reused while its stamp names the same packages. `standin_server.py` is what runs in it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.processes import ManagedProcess, Processes, http_probe

OMNI_VERSION = "0.1.9"
PACKAGES = (
    "av==18.1.0",
    "fastapi==0.165.0",
    "httpx==0.29.0",
    "msgpack==1.2.4",
    "msgspec==0.23.0",
    "numpy==2.4.6",
    "pybase64==1.5.1",
    "pydantic==2.14.4",
    "python-multipart==0.0.34",
    "pyzmq==27.3.0",
    "soundfile==0.14.0",
    "uvicorn==0.55.0",
    "xxhash==4.1.0",
)
"""What `sglang_omni.serve.openai_api` and `sglang_omni.client` import (found by importing them:
python-multipart for the voice-upload routes' forms, httpx for utils/audio.py), pinned to the versions the
suite was run with."""
STANDIN = Path(__file__).with_name("standin_server.py")
MODEL = "qwen3-omni"


def venv_dir() -> Path:
    cache = os.environ.get("OMNIGATE_ENGINE_CACHE") or str(Path.home() / ".cache" / "omnigate")
    return Path(cache) / f"sglang-omni-{OMNI_VERSION}"


def prepare_venv() -> Path:
    """The venv's python, built if missing or stale (idempotent; one builder at a time across processes)."""
    root = venv_dir()
    python = root / "bin" / "python"
    wanted = "\n".join((f"sglang-omni=={OMNI_VERSION} --no-deps", *PACKAGES)) + "\n"
    stamp = root / ".omnigate-ready"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".sglang-omni-{OMNI_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == wanted and python.exists():
            return python
        shutil.rmtree(root, ignore_errors=True)
        steps = [
            [sys.executable, "-m", "venv", str(root)],
            [str(python), "-m", "pip", "install", "-q", "--no-deps", f"sglang-omni=={OMNI_VERSION}"],
            [str(python), "-m", "pip", "install", "-q", *PACKAGES],
            [str(python), str(STANDIN), "--check"],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                pytest.fail(
                    f"preparing the sglang-omni {OMNI_VERSION} venv at {root} failed at {' '.join(step)}:\n"
                    f"{done.stdout[-2000:]}{done.stderr[-2000:]}",
                    pytrace=False,
                )
        stamp.write_text(wanted)
    return python


def start(group: Processes, name: str = "sglang-omni") -> ManagedProcess:
    """The real app with the stand-in coordinator on a free loopback port; ready when /health is 200."""
    python = prepare_venv()
    child = ManagedProcess(
        name,
        [str(python), str(STANDIN), "--port", "{port}", "--model-name", MODEL],
        group.log_dir / f"{name}.log",
        http_probe("/health"),
    )
    group.children.append(child)
    return child.start(timeout=60.0)


def set_running(url: str, running: bool) -> None:
    """The stand-in coordinator's `running` flag, which the app's /health reports."""
    httpx.post(url + "/standin/health", json={"running": running}, trust_env=False).raise_for_status()


def set_overloaded(url: str, overloaded: bool) -> None:
    """Every request the app takes is refused with a full queue before its output (or none is)."""
    httpx.post(url + "/standin/overload", json={"overloaded": overloaded}, trust_env=False).raise_for_status()


def refused(url: str) -> int:
    """Requests refused with a full queue so far (while overloaded)."""
    count = httpx.get(url + "/standin/aborts", trust_env=False).json()["refused"]
    assert isinstance(count, int)
    return count


def aborted(url: str) -> list[str]:
    """The request ids the app aborted on its coordinator so far."""
    reply = httpx.get(url + "/standin/aborts", trust_env=False)
    reply.raise_for_status()
    ids = reply.json()["aborted"]
    assert isinstance(ids, list)
    return [str(i) for i in ids]


if __name__ == "__main__":  # `make test-omni`: prepare the venv before the tests (idempotent)
    print(prepare_venv())
