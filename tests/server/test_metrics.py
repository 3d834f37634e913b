"""The counting helpers keep their labelled counters, and count into the very series Prometheus
renders: each call adds exactly one, per route (and code), however many calls came before."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from rollserve.server.metrics import Metrics


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render()[0].decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def test_requests_and_errors_are_counted_once_per_call_by_route_and_code() -> None:
    metrics = Metrics()
    for _ in range(3):
        metrics.count_request("step")
    metrics.count_request("batch_step")
    metrics.count_error("step", "invalid_request")
    metrics.count_error("step", "invalid_request")
    metrics.count_error("step", "session_not_found")
    metrics.count_error("policy_ws", "invalid_request")
    metrics.errors.labels(route="step", code="invalid_request").inc()  # the same series as labels()
    assert _samples(metrics) == {
        ("rollserve_requests_total", (("route", "step"),)): 3.0,
        ("rollserve_requests_total", (("route", "batch_step"),)): 1.0,
        ("rollserve_errors_total", (("code", "invalid_request"), ("route", "step"))): 3.0,
        ("rollserve_errors_total", (("code", "session_not_found"), ("route", "step"))): 1.0,
        ("rollserve_errors_total", (("code", "invalid_request"), ("route", "policy_ws"))): 1.0,
    }
