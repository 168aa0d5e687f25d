"""The built wheel, installed into a fresh venv, runs `omnigate demo` from a directory that is not the repo.

Offline: the wheel is built (from a copy of the tree, so the build leaves nothing in the repo) without
build isolation, and installed with `--no-deps --no-index`; the
dependencies come from the dev venv's site-packages through a `.pth` line (a plain path line: the dev
venv's own `.pth` files, among them its editable-install hook, are not processed), never from the source
tree, which is neither on the path nor the working directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_NO_INDEX"] = "1"
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed; its bin directory."""
    work = tmp_path_factory.mktemp("wheel")
    source, dist = work / "source", work / "dist"
    skip = shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__", "var", "reports")
    shutil.copytree(ROOT, source, symlinks=True, ignore=skip)
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-build-isolation", "-q",
         "-w", str(dist), str(source)],
        cwd=work,
    )  # fmt: skip
    (wheel,) = dist.glob("omnigate-*.whl")
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], work)
    dev_site = sysconfig.get_paths()["purelib"]
    (Path(site.stdout.strip()) / "omnigate-test-deps.pth").write_text(dev_site + "\n")
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], cwd=work)
    return env_dir / "bin"


def test_the_wheel_ships_the_demo_config_and_its_policy(installed: Path, tmp_path: Path) -> None:
    code = "import gateway, omnigate.demo.plan as p; print(gateway.__file__); print(p.default_config())"
    out = _run([str(installed / "python"), "-c", code], cwd=tmp_path).stdout.splitlines()
    product, config = Path(out[0]), Path(out[1])
    assert "site-packages" in product.parts and ROOT not in product.parents
    assert "site-packages" in config.parts and ROOT not in config.parents
    assert config.read_bytes() == (ROOT / "omnigate" / "demo" / "demo.yaml").read_bytes()
    assert (config.parent / "policy.yaml").read_bytes() == (ROOT / "policies" / "default.yaml").read_bytes()


@pytest.mark.timeout(180)
def test_omnigate_demo_runs_from_another_directory(installed: Path, tmp_path: Path) -> None:
    done = _run(
        [str(installed / "omnigate"), "demo", "--duration", "4", "--time-scale", "20", "--port", "0",
         "--print-every", "2"],
        cwd=tmp_path,
    )  # fmt: skip
    out = done.stdout
    assert "omnigate demo is up: http://127.0.0.1:" in out
    summary = next(line for line in out.splitlines() if line.startswith("demo summary: "))
    counts = dict(pair.split("=") for pair in summary.removeprefix("demo summary: ").split())
    assert int(counts["ok"]) >= 1 and int(counts["failed"]) == 0, out[-3000:]
    assert "stopped 5 processes: " in out and "killed" not in out
