"""The deployment's /metrics: every replica's registry merged into one valid exposition."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from rollserve.scale.metrics import merge_reports
from rollserve.server.metrics import Metrics


def test_each_family_once_with_every_replicas_samples_labelled() -> None:
    a, b = Metrics(), Metrics()
    a.requests.labels(route="step").inc(3)
    b.requests.labels(route="step").inc(4)
    b.active_sessions.labels(kind="policy").set(1)
    a.active_sessions.labels(kind="rollout").set(5)  # each replica sees the shared table's total
    b.active_sessions.labels(kind="rollout").set(4)  # (cached: a second old)
    text = merge_reports({"r1": a.render()[0], "r2": b.render()[0]}, {"sessions": 5, "commits": 7}).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}  # parses: valid exposition
    assert text.count("# TYPE rollserve_requests_total counter") == 1
    steps = {
        s.labels["replica"]: s.value
        for s in families["rollserve_requests"].samples
        if s.name == "rollserve_requests_total"
    }
    assert steps == {"r1": 3.0, "r2": 4.0}
    policy = [s for s in families["rollserve_active_sessions"].samples if s.labels.get("kind") == "policy"]
    assert [(s.labels["replica"], s.value) for s in policy] == [("r2", 1.0)]
    rollout = [s for s in families["rollserve_active_sessions"].samples if s.labels.get("kind") == "rollout"]
    assert rollout == []  # the deployment's total is rollserve_deployment_sessions, counted once
    assert families["rollserve_deployment_replicas"].samples[0].value == 2
    assert families["rollserve_deployment_sessions"].samples[0].value == 5
    assert families["rollserve_deployment_commits"].samples[0].value == 7
