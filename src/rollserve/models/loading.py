"""Load a user's policy from a spec string, with errors that say what to fix.

``module.path:factory`` calls the user's factory; ``lerobot:PATH`` loads a LeRobot checkpoint
directory through :mod:`rollserve.adapters.lerobot` (``lerobot:`` is reserved for that).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from functools import partial
from typing import Any

from rollserve.models.policy import Policy, PolicyMetadata

LEROBOT_PREFIX = "lerobot:"


class PolicyLoadError(ValueError):
    """The spec does not name a loadable policy; the message says why."""


def import_spec_module(spec: str, module_path: str, kind: str, error: type[ValueError]) -> Any:
    """The module a ``module.path:factory`` spec names; a missing module, a missing dependency of
    it or an import that fails becomes ``error`` with a message that says which (policies and
    worlds are loaded from such specs alike)."""
    try:
        return importlib.import_module(module_path)
    except ModuleNotFoundError as exc:
        if exc.name is None:  # raised by the module itself, naming no module: shown as raised, below
            raise error(
                f"{kind} spec {spec!r}: importing {module_path!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        if module_path == exc.name or module_path.startswith(exc.name + "."):
            raise error(f"{kind} spec {spec!r}: no module named {module_path!r}") from None
        raise error(
            f"{kind} spec {spec!r}: module {module_path!r} needs {exc.name!r}, which is not installed"
        ) from exc
    except Exception as exc:
        raise error(
            f"{kind} spec {spec!r}: importing {module_path!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def load_policy(spec: str, **kwargs: Any) -> Policy:
    """Import ``module.path`` and call ``factory(**kwargs)``; the result must be a :class:`Policy`.

    ``factory`` may also name a ready policy object (then ``kwargs`` must be empty).
    ``lerobot:PATH`` loads a LeRobot checkpoint directory (``kwargs`` go to its loader).
    """
    return policy_builder(spec, **kwargs)()


def policy_builder(spec: str, **kwargs: Any) -> Callable[[], Policy]:
    """What loads the policy ``spec`` names, resolved but not called: a Serve deployment checks a
    spec this way before its replicas load the policy on their own devices. A spec that names
    nothing loadable raises ``PolicyLoadError`` (a ``lerobot:PATH`` directory is read only when
    called: it is on the replicas' nodes)."""
    if spec.startswith(LEROBOT_PREFIX):
        if not spec[len(LEROBOT_PREFIX) :]:
            raise PolicyLoadError("policy spec 'lerobot:' needs a checkpoint directory: 'lerobot:PATH'")
        return partial(_load_lerobot, spec, **kwargs)
    module_path, sep, attr = spec.partition(":")
    if not sep or not module_path or not attr or ":" in attr:
        hint = ""
        if os.path.isdir(spec):
            hint = f"; to serve a LeRobot checkpoint directory use 'lerobot:{spec}'"
        raise PolicyLoadError(f"policy spec {spec!r} must look like 'package.module:factory'{hint}")
    module = import_spec_module(spec, module_path, "policy", PolicyLoadError)
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise PolicyLoadError(f"policy spec {spec!r}: {module_path!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if isinstance(getattr(target, "metadata", None), PolicyMetadata) and not isinstance(target, type):
        if kwargs:
            raise PolicyLoadError(f"policy spec {spec!r} names a policy object; it takes no arguments")
        return partial(_checked, target, spec)
    if not callable(target):
        raise PolicyLoadError(f"policy spec {spec!r}: {attr!r} is neither a factory nor a policy")
    return partial(_call_factory, target, spec, attr, kwargs)


def _call_factory(factory: Callable[..., Any], spec: str, attr: str, kwargs: dict[str, Any]) -> Policy:
    try:
        policy = factory(**kwargs)
    except Exception as exc:
        raise PolicyLoadError(
            f"policy spec {spec!r}: calling {attr}() failed: {type(exc).__name__}: {exc}"
        ) from exc
    return _checked(policy, spec)


def _checked(policy: Any, spec: str) -> Policy:
    _check_policy(policy, spec)
    return policy


def _load_lerobot(spec: str, **kwargs: Any) -> Policy:
    from rollserve.adapters.lerobot import load_lerobot_policy

    path = spec[len(LEROBOT_PREFIX) :]
    try:
        policy = load_lerobot_policy(path, **kwargs)
    except TypeError as exc:
        raise PolicyLoadError(f"policy spec {spec!r}: bad argument: {exc}") from exc
    except ValueError as exc:
        raise PolicyLoadError(f"policy spec {spec!r}: {exc}") from exc
    _check_policy(policy, spec)
    return policy


def _check_policy(policy: Any, spec: str) -> None:
    if not isinstance(getattr(policy, "metadata", None), PolicyMetadata):
        raise PolicyLoadError(
            f"policy spec {spec!r} returned {type(policy).__name__}, which has no PolicyMetadata 'metadata'"
        )
    if not callable(getattr(policy, "predict_action_chunk", None)):
        raise PolicyLoadError(
            f"policy spec {spec!r} returned {type(policy).__name__} without predict_action_chunk()"
        )
    meta = policy.metadata
    if meta.chunk_size < 1 or meta.action_dim < 1:
        raise PolicyLoadError(f"policy spec {spec!r}: metadata needs chunk_size >= 1 and action names")
    if meta.supports_batching and not callable(getattr(policy, "predict_action_chunks", None)):
        raise PolicyLoadError(f"policy spec {spec!r} declares batching but has no predict_action_chunks()")
