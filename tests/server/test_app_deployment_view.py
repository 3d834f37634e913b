"""One replica of a scaled-out deployment: ``create_app(deployment=...)`` answers ``/metrics`` and
``/v1/models`` for the whole deployment, over real HTTP. The deployment itself is a small stand-in
here (the Ray tests, in their own venv, run the real one); the app's composition is under test."""

from __future__ import annotations

from typing import Any

import httpx

from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

MERGED = b"# HELP deployment_total every replica\n# TYPE deployment_total counter\ndeployment_total 7.0\n"


class TwoReplicas:
    """What ``rollserve.scale`` gives the app: merged metrics and the deployment's facts."""

    async def metrics(self) -> tuple[bytes, str]:
        return MERGED, "text/plain; version=0.0.4; charset=utf-8"

    async def describe(self) -> dict[str, Any]:
        return {"replicas": 2, "sessions": 5}


def test_a_replica_answers_metrics_and_models_for_the_deployment() -> None:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    app = create_app(settings, rollout=RolloutService(ToyWorld(), settings), deployment=TwoReplicas())
    with serving(app) as server, httpx.Client(base_url=server.http_url, timeout=30) as http:
        metrics = http.get("/metrics")
        assert metrics.status_code == 200 and metrics.content == MERGED
        assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        listing = http.get("/v1/models").json()
        assert listing["object"] == "list" and listing["deployment"] == {"replicas": 2, "sessions": 5}
        assert [model["id"] for model in listing["data"]] == ["toy"]


def test_a_single_process_lists_no_deployment_and_its_own_metrics() -> None:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings))) as server:
        listing = httpx.get(server.http_url + "/v1/models", timeout=30).json()
        assert "deployment" not in listing and [model["id"] for model in listing["data"]] == ["toy"]
        assert "rollserve_" in httpx.get(server.http_url + "/metrics", timeout=30).text
