"""The Dockerfile, built and started with buildah where buildah is installed (skipped visibly elsewhere).

The base image: `OMNIGATE_TEST_BASE_IMAGE` if set; else the Dockerfile's own (Docker's Python image) if it
can be pulled; else one made here from Debian's packages with debootstrap (bookworm's python3 3.11, the
host's CA bundle for pip), kept in buildah's storage as `localhost/omnigate-base:bookworm` for the next
run; else the test is skipped, saying what to install. The build runs
with chroot isolation and the server with `buildah run` in the image's filesystem, as the image's user, on
the host's network (it reaches the simulator on loopback): a machine whose container runtime may not set
rlimits (some sandboxes) can still build and start it that way. What is checked: the image's config
(non-root user, exec-form entrypoint, HEALTHCHECK on /readyz, SIGTERM), the server starting from the
mounted config and policy, its health check passing, a request answered, and SIGTERM draining the stream
in flight before the server exits 0.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from loadtest.ports import free_port
from tests.integration.conftest import MODEL
from tests.support.processes import ManagedProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/omnigate:{VERSION}"
DOCKERFILE_BASE = "python:3.11-slim-bookworm"
LOCAL_BASE = "localhost/omnigate-base:bookworm"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _buildah(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout)


def _base(workdir: Path) -> str:
    """The base image the Dockerfile is built on here (see the module docstring)."""
    given = os.environ.get("OMNIGATE_TEST_BASE_IMAGE")
    if given:
        return given
    if _buildah("inspect", "--type", "image", LOCAL_BASE).returncode == 0:
        return LOCAL_BASE
    if _buildah("pull", DOCKERFILE_BASE, timeout=300).returncode == 0:
        return DOCKERFILE_BASE
    if shutil.which("debootstrap") is None or shutil.which("podman") is None:
        pytest.skip(
            f"{DOCKERFILE_BASE} cannot be pulled here and there is no debootstrap/podman to make a base "
            "(apt-get install -y debootstrap podman), nor OMNIGATE_TEST_BASE_IMAGE"
        )
    rootfs = workdir / "rootfs"
    made = subprocess.run(
        ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates", "bookworm",
         str(rootfs), "http://deb.debian.org/debian"],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    if made.returncode != 0:  # the mirror out of reach: the machine's, not the image's failure
        pytest.skip(f"debootstrap could not make a base here: {made.stdout[-500:]}{made.stderr[-500:]}")
    changes = ["--change", 'CMD ["python3"]']
    if CA_BUNDLE.exists():  # the host's trust, for a pip behind a TLS-inspecting proxy
        shutil.copy(CA_BUNDLE, rootfs / CA_BUNDLE.relative_to("/"))
        changes += ["--change", f"ENV PIP_CERT={CA_BUNDLE}"]
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["podman", "import", *changes, "-", LOCAL_BASE], stdin=tar.stdout, check=True, timeout=600)
    assert tar.wait() == 0
    return LOCAL_BASE


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("buildah") is None:
        pytest.skip("buildah is not installed (apt-get install -y buildah): the image is not built here")
    base = _base(tmp_path_factory.mktemp("base"))
    built = _buildah(
        "bud", "--isolation", "chroot", "--format", "docker", "--layers",
        "--build-arg", f"PYTHON_IMAGE={base}", "-t", IMAGE, str(ROOT),
        timeout=1500,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    return IMAGE


def _config(image: str) -> dict:
    out = _buildah("inspect", "--type", "image", image)
    assert out.returncode == 0, out.stderr
    config: dict = json.loads(out.stdout)["Docker"]["config"]
    return config


def test_the_image_runs_as_its_own_user_with_a_health_check_and_signals_reaching_the_server(
    image: str,
) -> None:
    config = _config(image)
    assert config["User"] == "omnigate"
    assert config["Entrypoint"] == ["omnigate", "serve"]  # exec form: no shell in between as PID 1
    assert config["Cmd"] == ["--config", "/etc/omnigate/gateway.yaml"]
    assert config["StopSignal"] == "SIGTERM"
    assert "8080/tcp" in config["ExposedPorts"]
    test = config["Healthcheck"]["Test"]
    assert test[0] == "CMD" and any("/readyz" in part for part in test)


@pytest.fixture
def container(image: str) -> Iterator[str]:
    made = _buildah("from", "--pull-never", image)
    assert made.returncode == 0, made.stderr
    name = made.stdout.strip()
    try:
        yield name
    finally:
        _buildah("rm", name)


def _server_pid(port: int) -> int:
    """The server's process on the host (buildah's chroot isolation runs it as a host process)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"OMNIGATE_LISTEN__PORT={port}".encode() in env and b"serve" in cmd:
            return int(proc.name)
    raise LookupError


def test_the_image_serves_from_mounted_files_and_drains_on_sigterm(
    image: str, container: str, sim: ManagedProcess, tmp_path: Path
) -> None:
    port = free_port()
    gateway = tmp_path / "gateway.yaml"
    gateway.write_text(
        yaml.safe_dump(
            {
                "policy_path": "policies/default.yaml",
                "auth": {"required": False},
                "store": {"kind": "memory"},
                "shutdown": {"drain_s": 20},
                "pools": [{"name": "interactive", "models": [MODEL], "backends": [sim.url]}],
            }
        )
    )
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "default.yaml").write_text("version: 1\n")
    config = _config(image)
    argv = [
        "buildah", "run", "--isolation", "chroot", "--user", config["User"],
        "--env", f"OMNIGATE_LISTEN__PORT={port}",
        "--volume", f"{gateway}:/etc/omnigate/gateway.yaml:ro",
        "--volume", f"{policies}:/etc/omnigate/policies:ro",
        container, "--", *config["Entrypoint"], *config["Cmd"],
    ]  # fmt: skip
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return httpx.get(url + "/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=60, interval=0.3)
        check = config["Healthcheck"]["Test"][1:]  # the image's own check, at this run's port
        env = f"OMNIGATE_LISTEN__PORT={port}"
        health = _buildah("run", "--isolation", "chroot", "--env", env, container, "--", *check)
        assert health.returncode == 0, health.stderr
        answer = httpx.post(
            url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
            timeout=30,
        )
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 8
        # a long stream in flight, then SIGTERM: the drain lets it finish, then the server exits 0
        chunks: list[str] = []
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400}

        def stream() -> None:
            with httpx.stream(
                "POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60
            ) as r:
                chunks.extend(r.iter_lines())

        reader = threading.Thread(target=stream)
        reader.start()
        wait_for(lambda: len(chunks) > 2 or None, timeout=30)
        os.kill(_server_pid(port), signal.SIGTERM)
        assert wait_for(lambda: not ready() or None, timeout=10)  # draining: /readyz answers 503 or nothing
        reader.join(timeout=60)
        assert chunks[-1] == "data: [DONE]" or chunks[-2] == "data: [DONE]"
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert "Application shutdown complete" in log.read_text() or server.returncode == 0
