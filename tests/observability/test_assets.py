"""config/prometheus and config/grafana: well-formed, and naming only metrics the gateway exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from gateway.observability.metrics import REGISTRY
from gateway.observability.settings import RuleName
from tests.observability.exposition import exported_names

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "config" / "prometheus" / "omnigate-alerts.yml"
RULE_TESTS = Path(__file__).resolve().parent / "promtool" / "omnigate-alerts-test.yml"
DASHBOARD = ROOT / "config" / "grafana" / "omnigate-dashboard.json"

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
_CLAUSE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: strings, matchers, ranges, grouping clauses removed."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = _CLAUSE.sub("", e)
    return {n for n in _NAME.findall(e) if n.lower() not in _KEYWORDS}


def test_promql_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, a) (rate(x_bucket{a="b",c=~"d|e"}[5m]))) > on(a) max(y) / 1e9'
    )
    assert promql_metric_names(expr) == {"x_bucket", "y"}


def _unknown(exprs: list[str]) -> dict[str, set[str]]:
    exported = exported_names(REGISTRY)
    out = {}
    for expr in exprs:
        names = promql_metric_names(expr)
        assert names, f"no metric in {expr!r}"
        if names - exported:
            out[expr] = names - exported
    return out


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    assert isinstance(doc, dict) and set(doc) == {"groups"}
    rules = []
    for group in doc["groups"]:
        assert set(group) == {"name", "rules"} and isinstance(group["name"], str)
        rules += group["rules"]
    return rules


def test_alert_rules_file_structure() -> None:
    rules = _rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r["alert"]
        assert isinstance(r["expr"], str) and r["expr"].strip()
        assert "for" not in r or re.fullmatch(r"\d+(ms|s|m|h|d|w|y)", r["for"]), r["alert"]
        assert r["labels"]["severity"] in {"critical", "warning"}
        assert r["annotations"]["summary"]
    # every rule the gateway evaluates itself has its Prometheus twin
    twins = {
        "queue_depth": "OmnigateQueueDepthHigh",
        "ttft_slo": "OmnigateTTFTP99OverSLO",
        "tpot_slo": "OmnigateTPOTP99OverSLO",
        "kv_usage": "OmnigateBackendKVUsageHigh",
        "backend_down": "OmnigateBackendDown",
        "rejection_rate": "OmnigateRejectionRateHigh",
    }
    assert set(twins) == set(get_args(RuleName))
    assert set(twins.values()) <= set(names)


def test_alert_rules_name_only_exported_metrics() -> None:
    assert _unknown([r["expr"] for r in _rules()]) == {}


@pytest.mark.e2e
def test_promtool_checks_rules_and_runs_their_unit_tests() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package `prometheus`): rules not checked by promtool")
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]):
        done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout + done.stderr


def _panels() -> list[dict[str, Any]]:
    model = json.loads(DASHBOARD.read_text())
    assert model["uid"] == "omnigate-overview" and model["title"]
    assert isinstance(model["schemaVersion"], int)
    return model["panels"]


def test_dashboard_is_a_valid_grafana_model() -> None:
    panels = _panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    graphs = [p for p in panels if p["type"] != "row"]
    for p in graphs:
        assert p["type"] == "timeseries" and p["title"]
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in ("h", "w", "x", "y")) and g["x"] + g["w"] <= 24
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs))
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    titles = " | ".join(p["title"] for p in graphs)
    for topic in ("Queue depth", "SLO attainment", "TTFT P99 vs SLO", "TPOT P99 vs SLO", "concurrency limit",
                  "KV cache usage", "Rejections by reason", "Tenant token usage"):  # fmt: skip
        assert topic in titles


def test_dashboard_queries_name_only_exported_metrics() -> None:
    exprs = [t["expr"] for p in _panels() if p["type"] != "row" for t in p["targets"]]
    assert len(exprs) > 20
    assert _unknown(exprs) == {}
