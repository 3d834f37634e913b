"""The counting helpers keep their labelled counters, and count into the very series Prometheus
renders: each call adds exactly one, per route (and code), however many calls came before."""

from __future__ import annotations

from typing import Any

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


# What /metrics promises (docs/protocol.md, "Metrics"): each series' name, type, help, labels and buckets.
TIME_BUCKETS = [
    "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0"
]  # fmt: skip
SIZE_BUCKETS = ["1.0", "2.0", "4.0", "8.0", "16.0", "32.0", "64.0"]


def _families(metrics: Metrics) -> dict[str, Any]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=")  # the text format (its version is the library's)
    families = text_string_to_metric_families(body.decode())
    # prometheus_client adds a ``_created`` timestamp per series; the parser reads it as a family of its own
    return {f.name: f for f in families if not f.name.endswith("_created")}


def test_every_series_has_its_documented_name_type_help_and_labels() -> None:
    metrics = Metrics()
    metrics.count_request("step")
    metrics.count_error("step", "invalid_request")
    metrics.queue_wait.labels(kind="world").observe(0.003)
    metrics.batch_observer("policy")(0.02, 3)
    metrics.active_sessions.labels(kind="rollout").set(2)
    families = _families(metrics)
    described = {name: (f.type, f.documentation) for name, f in families.items()}
    assert described == {
        "rollserve_requests": ("counter", "Requests handled"),
        "rollserve_errors": ("counter", "Requests answered with an error"),
        "rollserve_queue_wait_seconds": ("histogram", "Time waiting for the engine"),
        "rollserve_inference_seconds": ("histogram", "Model time per batch"),
        "rollserve_batch_size": ("histogram", "Requests per model call"),
        "rollserve_active_sessions": ("gauge", "Open sessions"),
    }
    label_names = {name: {frozenset(s.labels) - {"le"} for s in f.samples} for name, f in families.items()}
    assert label_names == {
        "rollserve_requests": {frozenset({"route"})},
        "rollserve_errors": {frozenset({"route", "code"})},
        "rollserve_queue_wait_seconds": {frozenset({"kind"})},
        "rollserve_inference_seconds": {frozenset({"kind"})},
        "rollserve_batch_size": {frozenset({"kind"})},
        "rollserve_active_sessions": {frozenset({"kind"})},
    }
    assert families["rollserve_active_sessions"].samples[0].value == 2


def _buckets(family: Any) -> list[str]:
    return [s.labels["le"] for s in family.samples if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"]


def test_the_histograms_buckets_are_the_documented_ones() -> None:
    metrics = Metrics()
    metrics.queue_wait.labels(kind="policy").observe(0.0)
    metrics.batch_observer("world")(0.0, 1)
    families = _families(metrics)
    assert _buckets(families["rollserve_queue_wait_seconds"]) == TIME_BUCKETS
    assert _buckets(families["rollserve_inference_seconds"]) == TIME_BUCKETS
    assert _buckets(families["rollserve_batch_size"]) == SIZE_BUCKETS


def test_a_batch_is_observed_once_with_its_model_time_and_size_under_its_kind() -> None:
    metrics = Metrics()
    observe = metrics.batch_observer("world")
    observe(0.004, 5)
    observe(0.25, 2)
    value = metrics.registry.get_sample_value
    world = {"kind": "world"}
    assert value("rollserve_inference_seconds_count", world) == 2.0
    assert value("rollserve_inference_seconds_sum", world) == 0.004 + 0.25
    assert value("rollserve_batch_size_count", world) == 2.0
    assert value("rollserve_batch_size_sum", world) == 7.0
    # 0.004 s falls in the 5 ms bucket, 0.25 s in the 250 ms one (each bucket counts what is at most its edge)
    assert value("rollserve_inference_seconds_bucket", {**world, "le": "0.0025"}) == 0.0
    assert value("rollserve_inference_seconds_bucket", {**world, "le": "0.005"}) == 1.0
    assert value("rollserve_inference_seconds_bucket", {**world, "le": "0.25"}) == 2.0
    assert value("rollserve_batch_size_bucket", {**world, "le": "4.0"}) == 1.0
    assert value("rollserve_inference_seconds_count", {"kind": "policy"}) is None


def test_each_app_process_registry_is_its_own() -> None:
    first, second = Metrics(), Metrics()
    first.count_request("step")
    assert second.registry.get_sample_value("rollserve_requests_total", {"route": "step"}) is None
