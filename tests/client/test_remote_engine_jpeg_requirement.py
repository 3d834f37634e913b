"""EngineConfig(jpeg_quality > 0) on a robot without simplejpeg (rollserve installed without the
``jpeg`` extra): the remote engine refuses at construction, naming the install, instead of
starting and failing every background request while the robot starves."""

from __future__ import annotations

import sys

import pytest

from rollserve.client import EngineConfig, LocalInferenceEngine, RemoteInferenceEngine
from rollserve.models.simple_policies import ChunkPolicy

URL = "ws://127.0.0.1:9/v1/policy/ws"  # never contacted: construction does not connect


@pytest.fixture
def no_simplejpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # ``import simplejpeg`` raises ImportError


def test_jpeg_without_simplejpeg_is_refused_naming_the_extra(no_simplejpeg: None) -> None:
    """Regression: start() succeeded, then every request failed with ModuleNotFoundError."""
    with pytest.raises(
        ImportError, match=r"jpeg_quality=80 needs simplejpeg.*pip install 'rollserve\[jpeg\]'"
    ):
        RemoteInferenceEngine(URL, EngineConfig(jpeg_quality=80))


def test_raw_images_and_local_engines_do_not_need_simplejpeg(no_simplejpeg: None) -> None:
    RemoteInferenceEngine(URL, EngineConfig(jpeg_quality=0))
    LocalInferenceEngine(ChunkPolicy(), EngineConfig(jpeg_quality=80))  # nothing is encoded in-process
