"""The one store of policy sessions: who is connected, their processors, epoch and superseded requests.

A session belongs to a robot (``client_uuid``). Reopening with the same uuid replaces the old session
and bumps the epoch, so anything still in flight for the old one is recognisably stale. An open
session's epoch lives on the session itself (never forgotten: clients drop replies by epoch); only
closed uuids' last epochs are kept in a bounded memory, so unknown uuids cannot grow it without end.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from rollserve.engine.policy_errors import INFERENCE_ERROR, UNKNOWN_SESSION, PolicyError
from rollserve.models.policy import Processors

logger = logging.getLogger(__name__)

_EPOCH_MEMORY = 10_000  # closed client uuids whose last epoch is remembered (oldest forgotten first)


@dataclass
class PolicySession:
    """Per-robot server state. ``processors`` are this session's own (they may keep state)."""

    session_id: str
    client_uuid: str = ""
    task: str = ""
    rtc_enabled: bool = True
    processors: Processors = field(default_factory=Processors)
    epoch: int = 0
    _superseded: list[int] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note_superseded(self, seq_id: int) -> None:
        with self._lock:
            self._superseded.append(seq_id)

    def take_superseded(self) -> list[int]:
        """Seq ids superseded since the last reply (reported once, in the next chunk)."""
        with self._lock:
            taken, self._superseded = self._superseded, []
        return sorted(taken)


class SessionLimitReached(Exception):
    """The server already holds its maximum number of sessions."""


class PolicySessionStore:
    """Sessions by id, one per client uuid, at most ``max_sessions``. Thread-safe."""

    def __init__(self, max_sessions: int, make_processors: Callable[[], Processors] = Processors) -> None:
        self.max_sessions = max_sessions
        self._make_processors = make_processors
        self._sessions: dict[str, PolicySession] = {}
        self._by_client: dict[str, str] = {}
        self._epochs: OrderedDict[str, int] = OrderedDict()  # closed uuids only, least recent first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def open(
        self,
        client_uuid: str = "",
        *,
        task: str = "",
        rtc_enabled: bool = True,
    ) -> PolicySession:
        """A fresh session (fresh processors). Replaces the client's previous one, with a higher epoch.

        Raises ``PolicyError`` (nothing changed) when the policy's ``make_processors()`` fails.
        """
        client_uuid = client_uuid or uuid.uuid4().hex
        processors = self._new_processors()
        with self._lock:
            previous = self._by_client.pop(client_uuid, None)
            if previous is not None:
                self._remember(self._sessions.pop(previous, None))
            if len(self._sessions) >= self.max_sessions:
                raise SessionLimitReached(f"server is at its limit of {self.max_sessions} policy sessions")
            epoch = self._epochs.pop(client_uuid, -1) + 1
            session = PolicySession(
                session_id=uuid.uuid4().hex,
                client_uuid=client_uuid,
                task=task,
                rtc_enabled=rtc_enabled,
                processors=processors,
                epoch=epoch,
            )
            self._sessions[session.session_id] = session
            self._by_client[client_uuid] = session.session_id
            return session

    def _remember(self, session: PolicySession | None) -> None:
        """Keep a closed (or replaced) session's epoch, so its uuid's next session starts above it.

        Called with the lock held. Only closed uuids are kept here, at most ``_EPOCH_MEMORY``, the
        least recently written forgotten first; open sessions carry their epoch themselves.
        """
        if session is None:
            return
        remembered = self._epochs.pop(session.client_uuid, -1)
        self._epochs[session.client_uuid] = max(remembered, session.epoch)
        while len(self._epochs) > _EPOCH_MEMORY:
            self._epochs.popitem(last=False)

    def _new_processors(self) -> Processors:
        try:
            return self._make_processors()
        except Exception as exc:
            logger.error("the policy's make_processors() failed", exc_info=exc)
            raise PolicyError(
                INFERENCE_ERROR,
                f"the policy's make_processors() failed: {type(exc).__name__}: {str(exc)[:300]}",
            ) from exc

    def is_open(self, session: PolicySession) -> bool:
        with self._lock:
            return self._sessions.get(session.session_id) is session

    def reset(self, session: PolicySession) -> int:
        """New episode: fresh processors, a new epoch, nothing superseded pending. Returns the epoch.

        Raises ``PolicyError`` (the session unchanged) when the policy's ``make_processors()`` fails.
        """
        processors = self._new_processors()
        with self._lock:
            if self._sessions.get(session.session_id) is not session:
                raise PolicyError(UNKNOWN_SESSION, "no such session (never opened, closed, or replaced)")
            epoch = session.epoch + 1
            session.epoch = epoch
            session.processors = processors
            session.take_superseded()
            return epoch

    def close(self, session_id: str) -> bool:
        """Forget a session; True when it was open (closing twice is harmless)."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
            if session is not None and self._by_client.get(session.client_uuid) == session_id:
                del self._by_client[session.client_uuid]
                self._remember(session)
            return session is not None
