"""Which LeRobot policy types rollserve serves, and what each one needs from the adapter.

Kept apart from the adapter so the table can be read (and documented) without importing LeRobot.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TypeSupport:
    """How one LeRobot policy type is driven.

    ``chunk_field``: the config field that gives the length of what ``predict_action_chunk``
    returns. ``rtc``: a flow policy whose ``predict_action_chunk`` takes LeRobot's RTC keywords.
    ``history``: keeps observation queues (``policy._queues``) that must be per session.
    ``noise``: ``predict_action_chunk`` accepts ``noise=`` (so a seed can fix it per session).
    ``noise_width``: the config field that gives the noise's last dimension.
    """

    chunk_field: str
    rtc: bool = False
    history: bool = False
    noise: bool = False
    noise_length_field: str = "chunk_size"
    noise_width: str = "max_action_dim"


SUPPORTED_TYPES: dict[str, TypeSupport] = {
    "act": TypeSupport(chunk_field="chunk_size"),
    "diffusion": TypeSupport(
        chunk_field="n_action_steps",
        history=True,
        noise=True,
        noise_length_field="horizon",
        noise_width="action_dim",
    ),
    "smolvla": TypeSupport(chunk_field="chunk_size", rtc=True, noise=True),
    "pi0": TypeSupport(chunk_field="chunk_size", rtc=True, noise=True),
    "pi05": TypeSupport(chunk_field="chunk_size", rtc=True, noise=True),
}


class UnsupportedPolicyType(ValueError):
    """The checkpoint's ``type`` is not one rollserve knows how to drive."""

    def __init__(self, policy_type: str) -> None:
        super().__init__(
            f"LeRobot policy type {policy_type!r} is not supported; rollserve serves "
            f"{', '.join(sorted(SUPPORTED_TYPES))}"
        )
        self.policy_type = policy_type
