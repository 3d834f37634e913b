"""Real-time chunking shared by client and server: config, action queue, prefix mask, delay estimate."""

from rollserve.rtc.config import RTCConfig
from rollserve.rtc.latency import LatencyTracker
from rollserve.rtc.prefix import normalize_prefix_length
from rollserve.rtc.queue import ActionQueue
from rollserve.rtc.weights import prefix_weights

__all__ = ["ActionQueue", "LatencyTracker", "RTCConfig", "normalize_prefix_length", "prefix_weights"]
