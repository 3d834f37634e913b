"""HTTP client for world-model rollout sessions: steps apply exactly once over a flaky network.

A lost reply is the hard case: the server may or may not have committed the step. The client asks
``status``, then resends the *same* ``step_id``: an uncommitted step runs now, a committed one is
answered from the server's stored result (``replayed``). Creating a session uses a client-chosen
id, so a retried create returns the same session. numpy, msgpack and httpx only.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import msgpack
import numpy as np

from rollserve.wire.codec import packb, unpackb
from rollserve.wire.errors import MALFORMED_FRAME, WireError
from rollserve.wire.images import IMAGE_KEY, decode_any_image
from rollserve.wire.msgpack_codec import FRAME_MAGIC
from rollserve.wire.msgpack_codec import _refuse_ext as refuse_ext  # the wire's own refusal
from rollserve.wire.tensors import NDARRAY_KEY, decode_array

MSGPACK = "application/msgpack"
# A proxy's 502/504, and 408: the server never got the whole body (``request_timeout``), so the
# request did not run; resending it is safe, as after a dropped connection.
RETRY_STATUSES = frozenset({408, 502, 504})
T = TypeVar("T")


class RolloutRequestError(Exception):
    """The server refused or failed a request; ``code`` is its error code (``inference_error``, ...)."""

    def __init__(
        self, code: str, message: str, *, status: int | None = None, committed_step_id: int | None = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.committed_step_id = committed_step_id


@dataclass(frozen=True)
class StepResult:
    """One committed (or stateless) step as the trainer sees it."""

    step_id: int
    observation: np.ndarray
    reward: float
    terminated: bool
    committed_step_id: int
    info: dict[str, Any] = field(default_factory=dict)
    replayed: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    state: np.ndarray | None = None  # a rendering session's state vector (next to its frames)
    images: dict[str, np.ndarray] | None = None  # a rendering session's camera images, uint8 HWC RGB
    actions: np.ndarray | None = None  # [1, 8]: the action a world-action model chose (step without action)


@dataclass(frozen=True)
class StepCall:
    """One item of :meth:`RolloutClient.batch_step`."""

    session_id: str
    step_id: int
    action: Any
    observation: dict[str, Any] | None = None
    use_session_context: bool = True


@dataclass(frozen=True)
class ColumnResults:
    """The answer of :meth:`RolloutClient.batch_step_columns`: row ``i`` answers session ``i``.

    A row holds a result when ``ok[i]``: its step committed now, or it was committed before and
    this is its stored result (``replayed[i]``). Any other row holds zeros and ``errors[i]``.
    """

    session_ids: list[str]
    step_ids: list[int]
    ok: np.ndarray  # bool (N,)
    replayed: np.ndarray  # bool (N,)
    observation: np.ndarray  # float32 (N, ...)
    reward: np.ndarray  # float64 (N,)
    terminated: np.ndarray  # bool (N,)
    committed_step_ids: np.ndarray  # int64 (N,)
    info: list[dict[str, Any]]
    errors: list[RolloutRequestError | None]
    state: np.ndarray | None = None  # float32 (N, S): the state vector, where the world reports one
    uncertainty: list[float | None] = field(default_factory=list)  # where the world reports one
    latency_ms: float = 0.0  # the server's time for the whole batch

    def results(self) -> list[StepResult | RolloutRequestError]:
        """Row by row, as :meth:`RolloutClient.batch_step` answers the same steps as items."""
        out: list[StepResult | RolloutRequestError] = []
        for i, error in enumerate(self.errors):
            if error is not None:
                out.append(error)
                continue
            committed = int(self.committed_step_ids[i])
            out.append(
                StepResult(
                    step_id=self.step_ids[i],
                    observation=self.observation[i],
                    reward=float(self.reward[i]),
                    terminated=bool(self.terminated[i]),
                    committed_step_id=committed,
                    info=self.info[i],
                    replayed=bool(self.replayed[i]),
                    metadata={
                        "committed_step_id": committed,
                        "uncertainty": self.uncertainty[i] if self.uncertainty else None,
                        "latency_ms": self.latency_ms,
                    },
                    state=None if self.state is None else self.state[i],
                )
            )
        return out


def unpack_reply(content: bytes) -> Any:
    """A msgpack reply body, unpacked without a Python hook per map and list.

    The server's counted decoder (``unpackb``) guards it against hostile clients by a budget checked
    in a hook on every container: ~0.35 ms of client CPU per 32-item ``batch_step`` answer. A reply
    is trusted as far as a JSON reply is (``resp.json()`` counts nothing either); extension types
    are still refused. Tensor maps stay maps here: :func:`decode_tensor_field` and
    :func:`decode_observation` build the arrays where the client expects them. An out-of-band
    frame goes through ``unpackb``.
    """
    if content[:4] == FRAME_MAGIC:
        return unpackb(content)
    try:
        return msgpack.unpackb(content, raw=False, ext_hook=refuse_ext)
    except WireError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise WireError(MALFORMED_FRAME, f"not a valid msgpack reply ({type(exc).__name__})") from None


def _array(value: Any) -> Any:
    """A tensor map (left as a map by :func:`unpack_reply`) as its array; anything else as it is."""
    return decode_array(value) if type(value) is dict and NDARRAY_KEY in value else value


def _image(value: Any) -> np.ndarray:
    """A camera image as a writable array, whatever the codec: a raw msgpack image is a read-only
    view into the reply (``decode_array``), which in-place ops and ``torch.from_numpy`` refuse, so
    it is copied; JPEG and JSON images are fresh arrays already and pass as they are."""
    if type(value) is dict and value.get(IMAGE_KEY) is True and type(value.get(b"pixels")) is dict:
        value = {**value, b"pixels": _array(value[b"pixels"])}
    return np.require(decode_any_image(_array(value)), requirements="W")


def decode_tensor_field(payload: dict[str, Any]) -> np.ndarray:
    """``next_observation`` (or ``observation``) as a float32 array, from either body encoding."""
    latent = _array(payload["video_latent"])
    if isinstance(latent, np.ndarray):
        return np.array(latent, dtype=np.float32)
    return np.frombuffer(base64.b64decode(latent), dtype="<f4").reshape(payload["shape"]).copy()


@dataclass(frozen=True)
class Observed:
    """An observation: the tensor (``video_latent``) and, for a rendering session, the state vector
    and the camera images (uint8 HWC RGB) next to it."""

    tensor: np.ndarray
    state: np.ndarray | None = None
    images: dict[str, np.ndarray] | None = None


def decode_observation(payload: dict[str, Any]) -> Observed:
    """``next_observation`` (or ``observation``) with its frames, from either body encoding."""
    state = payload.get("state")
    images = payload.get("images")
    return Observed(
        tensor=decode_tensor_field(payload),
        state=None if state is None else np.asarray(_array(state), dtype=np.float32),
        images=None if images is None else {str(k): _image(v) for k, v in images.items()},
    )


def check_action_size(size: int) -> None:
    """Refuse an action that is not the 8 DROID values before anything is sent for it."""
    if size != 8:
        raise ValueError(f"a DROID action has 8 values (7 joints + gripper), got {size}")


def action_body(action: Any) -> dict[str, Any]:
    """An 8-value DROID action as the API's ``{joint_positions, gripper_position}``."""
    values = np.asarray(action, dtype=np.float64).reshape(-1).tolist()
    check_action_size(len(values))
    return {"joint_positions": values[:7], "gripper_position": values[7]}


class RolloutClient:
    """Rollout sessions on a rollserve (or vLLM-Omni P0) server.

    Transport failures (connection errors, timeouts, 502/504, a proxy's bare 5xx) are retried with
    backoff, at most ``max_retries`` times; server refusals raise :class:`RolloutRequestError` at once,
    rollserve's typed ones as well as a genuine vLLM-Omni server's (FastAPI's ``{"detail"}`` or vLLM's
    error object).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 8,
        backoff_s: float = 0.02,
        max_backoff_s: float = 1.0,
        use_msgpack: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._transport = transport or httpx.HTTPTransport()
        self._base_url = base_url.rstrip("/")
        self._auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s).as_dict()
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.use_msgpack = use_msgpack
        self.retries = 0  # transport failures survived, for tests and logs

    # -- discovery ---------------------------------------------------------------------------------
    def models(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/models")["data"]

    def world(self, model: str | None = None) -> dict[str, Any]:
        """The ``/v1/models`` entry of a served world (the first one when ``model`` is None), found
        by its id or by one of its ``aliases`` (the other names the server creates it under)."""
        worlds = [m for m in self.models() if m.get("kind") == "world"]
        for entry in worlds:
            if model is None or entry["id"] == model or model in (entry.get("aliases") or ()):
                return entry
        wanted = f"world {model!r}" if model else "world"
        raise RolloutRequestError("model_not_found", f"the server serves no {wanted}")

    # -- sessions --------------------------------------------------------------------------------------
    def create_session(
        self,
        model: str,
        *,
        seed: int | None = None,
        session_id: str | None = None,
        render: dict[str, Any] | None = None,
    ) -> tuple[str, np.ndarray]:
        """A new session and its initial observation (the id is chosen here, so retrying is safe)."""
        sid, observed = self.open_session(model, seed=seed, session_id=session_id, render=render)
        return sid, observed.tensor

    def open_session(
        self,
        model: str,
        *,
        seed: int | None = None,
        session_id: str | None = None,
        render: dict[str, Any] | None = None,
    ) -> tuple[str, Observed]:
        """``create_session`` with the whole initial observation. ``render`` asks for camera frames
        with every observation: ``{"cameras": [...], "height": 64, "width": 64, "jpeg_quality": 0}``."""
        body: dict[str, Any] = {"model": model, "seed": seed, "session_id": session_id or uuid.uuid4().hex}
        if render is not None:
            body["render"] = render
        reply = self._call("POST", "/v1/realtime/sessions", body)
        return reply["session_id"], decode_observation(reply["observation"])

    def reset(self, session_id: str, *, seed: int | None = None) -> np.ndarray:
        """A new episode; the seed is drawn here when not given, so a retried reset lands the same."""
        return self.restart(session_id, seed=seed).tensor

    def restart(self, session_id: str, *, seed: int | None = None) -> Observed:
        """``reset`` with the whole initial observation (frames too, for a rendering session)."""
        seed = seed if seed is not None else int(np.random.default_rng().integers(2**31))
        reply = self._call("POST", f"/v1/realtime/sessions/{session_id}/reset", {"seed": seed})
        return decode_observation(reply["observation"])

    def fork(self, session_id: str, *, new_session_id: str | None = None) -> str:
        body = {"session_id": new_session_id or uuid.uuid4().hex}
        return self._call("POST", f"/v1/realtime/sessions/{session_id}/fork", body)["session_id"]

    def status(self, session_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/realtime/sessions/{session_id}/status")

    def close_session(self, session_id: str) -> None:
        self._call("POST", f"/v1/realtime/sessions/{session_id}/close")

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- steps ------------------------------------------------------------------------------------------
    def step(
        self,
        session_id: str,
        step_id: int,
        action: Any,
        *,
        observation: dict[str, Any] | None = None,
        use_session_context: bool = True,
    ) -> StepResult:
        """Apply ``action`` as step ``step_id``, exactly once however often the network drops it.

        ``action=None`` sends an empty ``Action()``: a world with a policy picks the action itself
        and returns it in ``StepResult.actions``; other worlds refuse with ``invalid_request``.
        """
        call = StepCall(session_id, step_id, action, observation, use_session_context)
        body = _step_body(call)
        path = f"/v1/realtime/sessions/{session_id}/step"
        for attempt in range(self.max_retries + 1):
            try:
                return _step_result(*self._send("POST", path, body))
            except httpx.TransportError:
                if attempt == self.max_retries:
                    raise
                self._pause(attempt)
                if use_session_context:
                    self._check_still_retryable(session_id, step_id)
        raise AssertionError("unreachable")

    def batch_step(self, calls: Sequence[StepCall]) -> list[StepResult | RolloutRequestError]:
        """Many sessions' steps in one request; resending it is safe (committed items replay)."""
        body = {"items": [{"session_id": c.session_id, **_step_body(c)} for c in calls]}
        reply = self._call("POST", "/v1/realtime/batch_step", body)
        _one_per_item(len(calls), len(reply["results"]))
        out: list[StepResult | RolloutRequestError] = []
        for item in reply["results"]:
            try:
                out.append(_step_result(None, item))
            except RolloutRequestError as exc:
                out.append(exc)
        return out

    def batch_step_columns(
        self, session_ids: Sequence[str], step_ids: Sequence[int], actions: Any
    ) -> ColumnResults:
        """One contextual step of each session, sent and answered as columns: ``actions`` is an
        ``(N, 8)`` array (7 joint positions, then the gripper). The same steps as
        :meth:`batch_step` items with those actions (they replay each other), at a fraction of the
        per-session cost; resending is safe. Sessions that render frames need :meth:`batch_step`."""
        rows = np.asarray(actions, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[1] != 8:
            raise ValueError(f"actions must be (N, 8): 7 joint positions, then the gripper; got {rows.shape}")
        body = {
            "session_ids": list(session_ids),
            "step_ids": [int(step_id) for step_id in step_ids],
            "actions": rows if self.use_msgpack else rows.tolist(),
        }
        payload = self._call("POST", "/v1/realtime/batch_step/columns", body)
        _one_per_item(len(body["session_ids"]), len(payload["session_ids"]))
        return _column_results(payload)

    # -- plumbing ----------------------------------------------------------------------------------------
    def _check_still_retryable(self, session_id: str, step_id: int) -> None:
        """After a lost reply: the step is either committed (the resend replays it) or not yet (it runs)."""
        committed = self.status(session_id)["committed_step_id"]  # retried like every call, once
        if committed not in (step_id - 1, step_id):
            raise RolloutRequestError(
                "step_conflict",
                f"step {step_id} cannot be retried: the session is at committed_step_id {committed}",
                committed_step_id=committed,
            )

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        status, payload = self._retrying(lambda: self._send(method, path, body))
        if status >= 400:
            raise _error(status, payload)
        return payload

    def _retrying(self, attempt: Callable[[], T]) -> T:
        for i in range(self.max_retries + 1):
            try:
                return attempt()
            except httpx.TransportError:
                if i == self.max_retries:
                    raise
                self._pause(i)
        raise AssertionError("unreachable")

    def _send(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        """One HTTP exchange; a 408/502/504, or a 5xx without a server's error body (:func:`_servers_answer`),
        counts as a transport failure (rollserve never answers 502/504, and its 408 means the body
        never arrived whole; its other 5xx carry a typed body, in either mode, and vLLM-Omni's carry
        FastAPI's or vLLM's).

        The request goes straight to the transport: these calls need no redirects, cookies or auth
        flows, and skipping ``httpx.Client``'s layers saves ~0.15 ms of client CPU per request.
        """
        headers = {**self._auth, "accept": MSGPACK if self.use_msgpack else "application/json"}
        content = None
        if body is not None:
            if self.use_msgpack:
                content, headers["content-type"] = packb(body), MSGPACK
            else:
                content, headers["content-type"] = json.dumps(body).encode(), "application/json"
        request = httpx.Request(
            method,
            self._base_url + path,
            content=content,
            headers=headers,
            extensions={"timeout": self._timeout},
        )
        resp = self._transport.handle_request(request)
        try:
            resp.read()
        finally:
            resp.close()
        if resp.status_code in RETRY_STATUSES:
            raise httpx.RemoteProtocolError(f"upstream answered {resp.status_code}", request=request)
        if resp.headers.get("content-type", "").startswith(MSGPACK):
            payload = unpack_reply(resp.content)
        else:
            try:
                payload = resp.json()
            except ValueError:
                payload = {"error": {"code": "http_error", "message": resp.text[:200]}}
        if resp.status_code >= 500 and not _servers_answer(resp.status_code, payload):
            # not the server's answer but a proxy's (Ray Serve answers a bare 500 when the replica
            # died under the request): the request may or may not have run, as after a lost reply
            raise httpx.RemoteProtocolError(f"upstream answered {resp.status_code}", request=request)
        return resp.status_code, payload

    def _pause(self, attempt: int) -> None:
        self.retries += 1
        time.sleep(min(self.max_backoff_s, self.backoff_s * 2**attempt))


def _typed_error(payload: Any) -> bool:
    """Whether a body is rollserve's own error, not a proxy's page: only a proxy's is retried.

    Strict mode and step bodies put the typed code in ``error.code``; vLLM-Omni mode puts the HTTP
    status there (a number) and the typed code in ``error.reason``. Either is the server's answer.
    """
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return False
    code = error.get("code")
    if isinstance(code, str):
        return code != "http_error"
    return _is_status(code) and isinstance(error.get("reason"), str) and bool(error["reason"])


def _servers_answer(status: int, payload: Any) -> bool:
    """Whether an error body is the server's own answer (raised at once), not a proxy's page.

    rollserve's typed bodies (:func:`_typed_error`), and a genuine vLLM-Omni server's: its routes
    raise ``HTTPException(status, detail=...)``, which FastAPI answers as ``{"detail": ...}`` (a
    list of ``{loc, msg}`` for a body that fails validation) and vLLM's handler as its error
    object, ``{"error": {"message", "type", "param", "code": <the status>}}``.
    """
    if _typed_error(payload):
        return True
    if not isinstance(payload, dict):
        return False
    if isinstance(payload.get("detail"), str | list):
        return True
    error = payload.get("error")
    return isinstance(error, dict) and error.get("code") == status and isinstance(error.get("message"), str)


def _is_status(value: Any) -> bool:
    """An HTTP status as vLLM's error body carries it in ``error.code`` (an int, never a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _step_body(call: StepCall) -> dict[str, Any]:
    return {
        "step_id": call.step_id,
        "observation": call.observation or {},
        "action": {} if call.action is None else action_body(call.action),
        "use_session_context": call.use_session_context,
    }


def _step_result(status: int | None, payload: dict[str, Any]) -> StepResult:
    """A success, or the replay of a committed step; any other answer raises (also an error status
    whose body is no step answer: FastAPI's ``{"detail"}`` for a body that failed validation)."""
    failed = payload.get("error") is not None or (status is not None and status >= 400)
    if failed and not payload.get("replayed"):
        raise _error(status, payload)
    nxt = payload["next_observation"]
    meta = payload["model_metadata"]
    observed = decode_observation(nxt)
    return StepResult(
        step_id=payload["step_id"],
        observation=observed.tensor,
        state=observed.state,
        images=observed.images,
        reward=float(nxt.get("reward", 0.0)),
        terminated=bool(nxt.get("terminated", False)),
        committed_step_id=meta["committed_step_id"],
        info=nxt.get("info") or {},
        replayed=bool(payload.get("replayed")),
        metadata=meta,
        actions=None if nxt.get("actions") is None else np.asarray(_array(nxt["actions"]), dtype=np.float32),
    )


def _one_per_item(sent: int, answered: int) -> None:
    """A batch's answer holds one result per item, in the items' order: one with another count
    cannot be matched to the steps sent (rollserve never answers so; a proxy or another server
    might), so it is refused as a whole rather than read row by row."""
    if answered != sent:
        raise RolloutRequestError("bad_response", f"the server answered {answered} results for {sent} items")


def _column_results(payload: dict[str, Any]) -> ColumnResults:
    nxt = payload["next_observation"]
    observed = decode_observation({k: v for k, v in nxt.items() if k != "state"})
    status = np.array([s == "ok" for s in payload["status"]], dtype=bool)
    replayed = np.array(payload["replayed"], dtype=bool)
    committed = payload["committed_step_ids"]
    errors = [
        None
        if error is None or done or again
        else RolloutRequestError(error["code"], error["message"], committed_step_id=last)
        for error, done, again, last in zip(payload["errors"], status, replayed, committed, strict=True)
    ]
    state = nxt.get("state")
    return ColumnResults(
        session_ids=list(payload["session_ids"]),
        step_ids=list(payload["step_ids"]),
        ok=status | replayed,
        replayed=replayed,
        observation=observed.tensor,
        reward=np.asarray(nxt["reward"], dtype=np.float64),
        terminated=np.asarray(nxt["terminated"], dtype=bool),
        committed_step_ids=np.asarray(committed, dtype=np.int64),
        info=list(nxt["info"]),
        errors=errors,
        state=None if state is None else np.array(_array(state), dtype=np.float32),
        uncertainty=list(payload["uncertainty"]),
        latency_ms=float(payload["latency_ms"]),
    )


def _error(status: int | None, payload: dict[str, Any]) -> RolloutRequestError:
    """The typed error of a refusal, in either status-code mode.

    Step bodies and strict-mode errors carry the typed code in ``error.code``; vLLM-Omni-mode
    non-step errors carry the HTTP status there (vLLM's error body) and the typed code in
    ``error.reason``. A body without a typed code (vLLM's error object, FastAPI's ``detail``) gets
    ``http_<status>`` and its message (a validation error's ``loc: msg`` items joined).
    """
    error = payload.get("error")
    error = error if isinstance(error, dict) else {}
    code = error.get("code")
    if not isinstance(code, str):
        reason = error.get("reason")
        code = reason if isinstance(reason, str) and reason else f"http_{status}"
    message = error.get("message") or _detail_text(payload.get("detail")) or f"HTTP {status}"
    return RolloutRequestError(
        str(code), str(message), status=status, committed_step_id=error.get("committed_step_id")
    )


def _detail_text(detail: Any) -> str:
    """FastAPI's ``detail`` as one line: a string as it is, a validation error's items as
    ``body.step_id: Input should be ...`` joined by ``; ``."""
    if not isinstance(detail, list):
        return "" if detail is None else str(detail)
    parts = []
    for item in detail:
        if isinstance(item, dict) and "msg" in item:
            where = ".".join(str(p) for p in item.get("loc") or ())
            parts.append(f"{where}: {item['msg']}" if where else str(item["msg"]))
        else:
            parts.append(str(item))
    return "; ".join(parts)
