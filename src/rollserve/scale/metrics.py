"""``/metrics`` for a whole deployment: every replica's Prometheus text merged, each sample labelled
with its replica, plus the deployment's own gauges (sessions held, capacity, commits, races lost)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

DEPLOYMENT_GAUGES = {
    "replicas": "Replicas that reported in the last 30 s",
    "sessions": "Open rollout sessions in the deployment",
    "capacity": "Most rollout sessions the deployment holds",
    "commits": "Rollout steps committed through the shared store",
    "conflicts": "Commits refused by the compare-and-set (a racing writer, a reset, a close)",
}


def merge_reports(reports: dict[str, bytes], deployment: dict[str, int]) -> bytes:
    """One exposition: each family once, its samples from every replica with a ``replica`` label."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for replica in sorted(reports):
        for family in text_string_to_metric_families(reports[replica].decode()):
            # the text format names a counter's family by its sample, ``<name>_total``
            name = f"{family.name}_total" if family.type == "counter" else family.name
            _, _, lines = families.setdefault(name, (family.documentation, family.type, []))
            for sample in family.samples:
                if _deployment_wide(sample.name, sample.labels):
                    continue
                labels = {**sample.labels, "replica": replica}
                body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
                lines.append(f"{sample.name}{{{body}}} {floatToGoString(sample.value)}")
    out: list[str] = []
    for name, (doc, kind, lines) in families.items():
        out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *lines]
    stats = {"replicas": len(reports), **deployment}
    for key, doc in DEPLOYMENT_GAUGES.items():
        if key in stats:
            name = f"rollserve_deployment_{key}"
            out += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name} {stats[key]}"]
    return ("\n".join(out) + "\n").encode()


def _deployment_wide(name: str, labels: dict[str, str]) -> bool:
    """A replica's rollout-session gauge is the shared table's total as that replica last saw it:
    summed over replicas it counts every session once per replica. ``rollserve_deployment_sessions``
    is the total, so those samples are left out."""
    return name == "rollserve_active_sessions" and labels.get("kind") == "rollout"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
