"""The Kubernetes manifests parse, and the gateway config and policy they ship validate."""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.livepolicy.policy import load_policy_text
from gateway.settings.config import parse_config

K8S = Path(__file__).resolve().parents[2] / "config" / "k8s"


def test_manifests_parse_and_ship_a_valid_redis_config() -> None:
    kinds = {d["kind"] for f in K8S.glob("*.yaml") for d in yaml.safe_load_all(f.read_text()) if d}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "Kustomization"} <= kinds
    data = yaml.safe_load((K8S / "configmap.yaml").read_text())["data"]
    config = parse_config(yaml.safe_load(data["gateway.yaml"]), environ={})
    assert (config.store.kind, config.store.redis_url) == ("redis", "redis://omnigate-redis:6379/0")
    assert config.policy_path == "/etc/omnigate/policies/default.yaml"
    assert load_policy_text(data["default.yaml"]).tenant_defaults.max_priority == 5
    deployment = next(yaml.safe_load_all((K8S / "gateway.yaml").read_text()))
    assert deployment["spec"]["replicas"] == 3
