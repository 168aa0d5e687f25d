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


def family_signatures(text: str, declared: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Family -> "type label,names" for every family a /metrics body describes, samples or not.

    Label names come from the family's samples (`le`/`quantile` aside); a labelled family nothing has touched
    yet has none, so its names come from `declared` (`label_names(registry)`), and `<family>_created` gauges
    are left out. That keeps a snapshot the same whichever other tests ran first in the process and touched
    more children of the shared registry.
    """
    families = list(text_string_to_metric_families(text))
    names = {f.name for f in families}
    out: dict[str, str] = {}
    for family in families:
        if family.name.endswith("_created") and family.name.removesuffix("_created") in names:
            continue  # prometheus-client's creation timestamps: present only once a child exists
        keys = {k for sample in family.samples for k in sample.labels if k not in ("le", "quantile")}
        if not family.samples:
            keys = set(declared.get(family.name, ()))
        out[family.name] = f"{family.type} {','.join(sorted(keys)) or '-'}"
    return out


def unsampled_families(text: str) -> set[str]:
    """Families a /metrics body declares (HELP/TYPE) without a single sample."""
    return {f.name for f in text_string_to_metric_families(text) if not f.samples}


def sample_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the one sample with exactly this name and these labels, or None if absent."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def sample_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels` (e.g. all backends of one pool)."""
    return sum(
        float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )
