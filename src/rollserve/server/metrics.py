"""Prometheus metrics, one registry per process (so tests can build many apps without clashes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """The counters every transport updates: requests, errors, queue wait, inference, sessions."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("rollserve_requests", "Requests handled", ["route"], registry=self.registry)
        self.errors = Counter(
            "rollserve_errors", "Requests answered with an error", ["route", "code"], registry=self.registry
        )
        self.queue_wait = Histogram(
            "rollserve_queue_wait_seconds",
            "Time waiting for the engine",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.inference = Histogram(
            "rollserve_inference_seconds",
            "Model time per batch",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "rollserve_batch_size",
            "Requests per model call",
            ["kind"],
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=self.registry,
        )
        self.active_sessions = Gauge(
            "rollserve_active_sessions", "Open sessions", ["kind"], registry=self.registry
        )
        self._requests: dict[str, Any] = {}
        self._errors: dict[tuple[str, str], Any] = {}

    def count_request(self, route: str) -> None:
        """One request on ``route``. The labelled counters are looked up once and kept: ``labels()``
        takes a lock and checks its arguments on every call, a few µs per request on the loop."""
        counter = self._requests.get(route)
        if counter is None:
            counter = self._requests[route] = self.requests.labels(route=route)
        counter.inc()

    def count_error(self, route: str, code: str) -> None:
        """One error answer. Routes and codes are the server's own names, so the kept set is small."""
        counter = self._errors.get((route, code))
        if counter is None:
            counter = self._errors[(route, code)] = self.errors.labels(route=route, code=code)
        counter.inc()

    def batch_observer(self, kind: str) -> Callable[[float, int], None]:
        """A ``BatchingWorker``'s ``on_batch``: model time and size, once per model call. Their
        HELP says per batch, and a transport, which sees only its own request, would count a batch
        of N N times."""
        inference, size = self.inference.labels(kind=kind), self.batch_size.labels(kind=kind)

        def observe(run_s: float, requests: int) -> None:
            inference.observe(run_s)
            size.observe(requests)

        return observe

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


METRICS = Metrics()
