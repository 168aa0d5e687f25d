"""config/k8s/ against the Kubernetes API schemas (the `kubernetes-validate` package ships them: offline),
and the Deployment runs the image the repository's Dockerfile builds."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "config" / "k8s"
KUBERNETES = "1.30.0"  # the oldest release the manifests promise to apply on


def _documents() -> list[tuple[str, dict[str, Any]]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    out = []
    for name in kustomization["resources"]:
        out += [(name, doc) for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]
    return out


def _gateway() -> dict[str, Any]:
    return next(
        d for _, d in _documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "omnigate"
    )


def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize("name,doc", _documents(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_manifest_is_valid_kubernetes(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises on an unknown or mistyped field


def test_an_invalid_manifest_is_caught() -> None:
    """The validation has teeth: a misspelt field of the real Deployment fails it."""
    deployment = _gateway()
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    broken = {**deployment}
    broken["spec"] = {
        **deployment["spec"],
        "template": {"spec": {"containers": [{**container, "imagePullPolicyy": "Always"}]}},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_the_deployment_runs_the_dockerfiles_image() -> None:
    """`omnigate:<version>`, the tag the README's `docker build` gives the Dockerfile's image; its
    arguments go to the image's entrypoint (`omnigate serve`), as the image's own non-root user."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    deployment = _gateway()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"omnigate:{version}"
    assert "command" not in container and container["args"] == ["--config", "/etc/omnigate/gateway.yaml"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["omnigate", "serve"]' in dockerfile and "USER omnigate" in dockerfile
    assert "useradd --system --uid 10001" in dockerfile
    assert container["securityContext"]["runAsUser"] == 10001
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"/etc/omnigate/gateway.yaml", "/etc/omnigate/policies"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
