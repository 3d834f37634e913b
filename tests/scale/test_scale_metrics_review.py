"""The merged ``/metrics`` where a mutation review found it unchecked: each family keeps the type its
replica gave it, label values that need escaping survive the merge, and only the rollout-session
samples are left out of a family. The reference is prometheus_client's own parser run on each
replica's text."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rollserve.scale.metrics import merge_reports
from rollserve.server.metrics import Metrics


def _parsed(text: bytes) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def test_every_family_keeps_the_type_and_help_its_replica_gave_it() -> None:
    replica = Metrics()
    replica.requests.labels(route="step").inc()
    replica.queue_wait.labels(kind="rollout").observe(0.01)
    replica.active_sessions.labels(kind="policy").set(2)
    own = _parsed(replica.render()[0])
    merged = _parsed(merge_reports({"r1": replica.render()[0]}, {}))
    assert {name: (f.type, f.documentation) for name, f in own.items()} == {
        name: (f.type, f.documentation) for name, f in merged.items() if name in own
    }
    assert {f.type for f in own.values()} >= {"counter", "histogram", "gauge"}  # each kind was checked


def test_label_values_that_need_escaping_come_back_as_they_were() -> None:
    registry = CollectorRegistry()
    odd = 'a "quoted" C:\\new\\ path\nand a new line'  # a backslash before an n too
    Counter("rollserve_odd", "Odd labels", ["what"], registry=registry).labels(what=odd).inc(3)
    merged = _parsed(merge_reports({"r1": generate_latest(registry)}, {}))
    (sample,) = [s for s in merged["rollserve_odd"].samples if s.name == "rollserve_odd_total"]
    assert sample.labels == {"what": odd, "replica": "r1"} and sample.value == 3.0


def test_a_replicas_samples_after_its_rollout_gauge_are_kept() -> None:
    replica = Metrics()
    replica.active_sessions.labels(kind="rollout").set(5)  # first in the family's samples
    replica.active_sessions.labels(kind="policy").set(1)
    merged = _parsed(merge_reports({"r1": replica.render()[0]}, {"sessions": 5}))
    kept = [(s.labels["kind"], s.value) for s in merged["rollserve_active_sessions"].samples]
    assert kept == [("policy", 1.0)]
