"""rollserve: serve robot policies (RTC action chunks) and world models (exactly-once rollouts)."""

__version__ = "0.1.0"
