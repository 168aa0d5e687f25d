"""Metric names and label sets from Prometheus text exposition or a registry, for snapshot tests.

`label_sets(text)` turns a /metrics body into {sample name: {frozenset of label names}}: stable across runs
(values and label values vary, names and label keys must not). `exported_names(registry)` lists every
sample name a registry can ever produce, including labelled metrics no request has touched yet.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "unknown": ("",),
}


def label_sets(text: str) -> dict[str, set[frozenset[str]]]:
    out: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            keys = frozenset(k for k in sample.labels if k not in ("le", "quantile"))
            out.setdefault(sample.name, set()).add(keys)
    return out


def label_names(registry: CollectorRegistry) -> dict[str, tuple[str, ...]]:
    """Family name -> label names, from each metric's description (works before any sample exists)."""
    out: dict[str, tuple[str, ...]] = {}
    for collector in list(registry._collector_to_names):
        labelnames = getattr(collector, "_labelnames", None)
        name = getattr(collector, "_name", None)
        if name is not None and labelnames is not None:
            out[name] = tuple(labelnames)
    return out


def exported_names(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
        names.update(s.name for s in family.samples)
    return names
