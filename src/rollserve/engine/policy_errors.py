"""Typed errors of the policy session protocol (on top of the wire codes in ``rollserve.wire.errors``).

Every rejection becomes an ``ErrorMsg`` with one of these stable codes; messages are short and
never carry a traceback.
"""

from __future__ import annotations

# Stable strings: part of the protocol (docs/protocol.md lists them).
UNKNOWN_SESSION = "unknown_session"  # no open session on this connection, or it was closed/replaced
STALE_EPOCH = "stale_epoch"  # the header's session_epoch is not the session's current one
INFERENCE_ERROR = "inference_error"  # the policy or a processor raised
UNAVAILABLE = "unavailable"  # the engine is shutting down; retry elsewhere or later
UNEXPECTED_MESSAGE = "unexpected_message"  # a valid message a client must not send (e.g. an ack)


class PolicyError(Exception):
    """A request the policy server refuses; ``code`` and ``message`` are safe to send to the client."""

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
