"""Real processes for the threat-model tests: `omnigate serve` in front of simulated SGLang backends.

A module shares one simulator (`sim`); each test starts the gateways it attacks through `procs` (stopped
at teardown whatever happened) — the integration tests' fixtures. `Deployment` writes a gateway config
and policy file of its own, so a test can edit the policy file the gateway watches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import MODEL, procs, sim  # noqa: F401 (procs, sim: fixtures used here too)
from tests.support.processes import ManagedProcess, Processes

ADMIN_TOKEN = "security-admin-token-3f9d"
TENANT_KEY = "og-security-tenant-key-0123456789abcdefghijklmnop"
SHORT_KEY = "sk-demo-alice"  # a short key declared in the config, as the demo's
POLICY = "version: 1\npool_defaults:\n  timeouts: {idle: 45.0}\n"


class Deployment:
    """One gateway's config and policy file in `root`; `start` runs `omnigate serve` on them."""

    def __init__(self, root: Path, backends: list[str], policy: str = POLICY, **config: Any) -> None:
        self.root = root
        self.policy = root / "policy" / "policy.yaml"  # a folder of its own: the watcher watches it
        self.policy.parent.mkdir(parents=True, exist_ok=True)
        self.policy.write_text(policy)
        self.config = root / "gateway.yaml"
        doc: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": 0},
            "policy_path": str(self.policy),
            "watch_policy": False,
            "admin": {"token": ADMIN_TOKEN},
            "auth": {"required": True},
            "store": {"kind": "memory"},
            "pools": [
                {"name": "interactive", "models": [MODEL], "backends": backends, "health_interval_s": 0.5}
            ],
            "alerts": {"evaluation_interval_s": 0.1},
            "tenants": [
                {"id": "tenant", "keys": [TENANT_KEY], "max_priority": 10},
                {"id": "alice", "keys": [SHORT_KEY]},
            ],
        }
        for key, value in config.items():
            doc[key] = {**doc[key], **value} if isinstance(value, dict) and key in doc else value
        self.config.write_text(yaml.safe_dump(doc))

    def start(self, group: Processes) -> ManagedProcess:
        return group.gateway(self.config)


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


ADMIN = auth(ADMIN_TOKEN)


def chat_body(content: Any = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2, **extra}


def label_sets(url: str) -> dict[str, set[frozenset[tuple[str, str]]]]:
    """Every omnigate_* sample name of a gateway's /metrics with the label sets it is exported with."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, set[frozenset[tuple[str, str]]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("omnigate_"):
                out.setdefault(s.name, set()).add(frozenset(s.labels.items()))
    return out


def sample(url: str, name: str, **labels: str) -> float:
    """One sample of a process's /metrics (0 when absent)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0
