"""The Kubernetes manifests fit the graceful drain: the pod's grace period covers preStop's pause, the
configured drain and the server's close, and readiness is the endpoint a drain turns 503."""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.http.server import CLOSE_GRACE_S
from gateway.settings.config import parse_config

K8S = Path(__file__).resolve().parents[2] / "config" / "k8s"


def test_termination_grace_covers_pre_stop_drain_and_close() -> None:
    deployment = next(
        d for d in yaml.safe_load_all((K8S / "gateway.yaml").read_text()) if d["kind"] == "Deployment"
    )
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    data = yaml.safe_load((K8S / "configmap.yaml").read_text())["data"]
    drain_s = parse_config(yaml.safe_load(data["gateway.yaml"]), environ={}).shutdown.drain_s
    assert (float(command[1]), drain_s) == (5.0, 25.0)
    assert pod["terminationGracePeriodSeconds"] > float(command[1]) + drain_s + CLOSE_GRACE_S
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
