"""Reviewed gaps of ``models/loading.py`` and ``models/worlds.py`` (mutation testing): how ``serve
--policy SPEC`` and ``--world NAME|module.path:factory`` load what they serve, through the real
loading code, on modules and checkpoints shipped in the repository (and, for the modules that
must fail, small modules written to a temporary folder and imported for real).

``serve`` prints these messages as they are (``rollserve serve: error: MESSAGE``), so where the
message is the behaviour it is pinned word for word."""

from __future__ import annotations

import importlib
import shutil
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from toy_rule import moved

from rollserve.models.learned_world import LearnedWorld
from rollserve.models.learned_world import default_checkpoint_dir as learned_dir
from rollserve.models.loading import PolicyLoadError, load_policy, policy_builder
from rollserve.models.simple_policies import ChunkPolicy, EchoPolicy
from rollserve.models.world import WorldInit, WorldStep
from rollserve.models.worlds import (
    NotAWorldError,
    ToyWorld,
    WorldLoadError,
    check_world_dependencies,
    load_world,
    world_builder,
)

SIMPLE = "rollserve.models.simple_policies"
TOY = "rollserve.models.worlds:ToyWorld"


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str], str]]:
    """Writes a module ``name`` with ``source`` where ``import`` finds it; forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> str:
        parts = name.split(".")
        for depth in range(1, len(parts)):
            package = tmp_path.joinpath(*parts[:depth])
            package.mkdir(exist_ok=True)
            (package / "__init__.py").touch()
        tmp_path.joinpath(*parts).with_suffix(".py").write_text(source)
        return name

    yield write
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def _policy_error(spec: str, **kwargs: Any) -> str:
    with pytest.raises(PolicyLoadError) as info:
        load_policy(spec, **kwargs)
    return str(info.value)


def _world_error(spec: str, **kwargs: Any) -> str:
    with pytest.raises(WorldLoadError) as info:
        load_world(spec, **kwargs)
    return str(info.value)


# -- import_spec_module: which module is missing, and what failed --------------------------------


def test_a_missing_package_of_a_dotted_spec_is_the_module_itself() -> None:
    """The package of ``pkg.sub`` missing: the user mistyped the spec, no dependency is missing."""
    assert _policy_error("no_such_pkg_qx.policies:make") == (
        "policy spec 'no_such_pkg_qx.policies:make': no module named 'no_such_pkg_qx.policies'"
    )
    assert _world_error("no_such_pkg_qx.worlds:make") == (
        "world spec 'no_such_pkg_qx.worlds:make': no module named 'no_such_pkg_qx.worlds'"
    )


def test_a_missing_submodule_of_a_real_package_is_the_module_itself() -> None:
    """A typo in the last part of a spec is the user's module missing, not a dependency of ours."""
    assert _policy_error("rollserve.models.no_such_policies:make") == (
        "policy spec 'rollserve.models.no_such_policies:make': "
        "no module named 'rollserve.models.no_such_policies'"
    )


def test_a_dependency_whose_name_prefixes_the_module_is_still_a_dependency(
    modules: Callable[[str, str], str],
) -> None:
    """``lint_policy`` importing a missing ``lint`` is a missing dependency, not a missing module:
    only a whole dotted part counts as the module's own package."""
    modules("lint_policy_qx", "import lint_qx\n")
    assert _policy_error("lint_policy_qx:make") == (
        "policy spec 'lint_policy_qx:make': module 'lint_policy_qx' needs 'lint_qx', which is not installed"
    )


def test_a_missing_dependency_of_a_world_module_names_it(modules: Callable[[str, str], str]) -> None:
    """A world module whose own import is missing names that module, so the user knows what to install."""
    modules("pkg_qx.world", "import torch_extras_qx\n")
    assert _world_error("pkg_qx.world:make") == (
        "world spec 'pkg_qx.world:make': module 'pkg_qx.world' needs 'torch_extras_qx', "
        "which is not installed"
    )


def test_an_import_that_fails_names_the_error(modules: Callable[[str, str], str]) -> None:
    """Any other failure while importing is shown with its type and text, not as a traceback."""
    modules("broken_policy_qx", "raise RuntimeError('no GPU visible')\n")
    assert _policy_error("broken_policy_qx:make") == (
        "policy spec 'broken_policy_qx:make': importing 'broken_policy_qx' failed: "
        "RuntimeError: no GPU visible"
    )
    modules("broken_world_qx", "1 / 0\n")
    assert _world_error("broken_world_qx:make") == (
        "world spec 'broken_world_qx:make': importing 'broken_world_qx' failed: "
        "ZeroDivisionError: division by zero"
    )


def test_a_module_not_found_error_without_a_name_is_an_import_failure(
    modules: Callable[[str, str], str],
) -> None:
    """A module that raises ``ModuleNotFoundError`` itself, naming no module: there is no missing
    module to name (it said "needs None" before), so the error is shown as it was raised."""
    modules("plugin_policy_qx", "raise ModuleNotFoundError('no plugin backend configured')\n")
    assert _policy_error("plugin_policy_qx:make") == (
        "policy spec 'plugin_policy_qx:make': importing 'plugin_policy_qx' failed: "
        "ModuleNotFoundError: no plugin backend configured"
    )


# -- policy specs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["no_colon_qx", "pkg.module:", ":factory", "pkg:a:b"])
def test_a_spec_that_is_no_module_and_factory_says_the_form(spec: str) -> None:
    """No module, no factory, or a second colon: the message shows the form a spec takes."""
    assert _policy_error(spec) == f"policy spec {spec!r} must look like 'package.module:factory'"


def test_a_directory_without_the_prefix_gets_the_lerobot_hint(tmp_path: Path) -> None:
    """A checkpoint folder passed as is is most likely a LeRobot one: the message says how to serve it."""
    assert _policy_error(str(tmp_path)) == (
        f"policy spec {str(tmp_path)!r} must look like 'package.module:factory'; "
        f"to serve a LeRobot checkpoint directory use 'lerobot:{tmp_path}'"
    )


def test_an_empty_lerobot_path_is_refused_in_full_words() -> None:
    """``lerobot:`` alone names no folder: refused when the spec is resolved."""
    assert _policy_error("lerobot:") == "policy spec 'lerobot:' needs a checkpoint directory: 'lerobot:PATH'"
    with pytest.raises(PolicyLoadError):
        policy_builder("lerobot:")  # refused when resolved, before anything is called


def test_a_lerobot_directory_is_read_only_when_the_builder_is_called(tmp_path: Path) -> None:
    """A Serve deployment resolves the spec on the head node; the folder is on the replicas'."""
    missing = tmp_path / "on_another_node"
    build = policy_builder(f"lerobot:{missing}")
    with pytest.raises(PolicyLoadError) as info:
        build()
    assert str(info.value) == f"policy spec 'lerobot:{missing}': {str(missing)!r} is not a directory"


def test_a_lerobot_argument_it_does_not_take_is_a_bad_argument(tmp_path: Path) -> None:
    """A ``--policy-arg`` the LeRobot loader does not take is named, before LeRobot is needed."""
    message = _policy_error(f"lerobot:{tmp_path}", temperature=0.5)
    assert message == (
        f"policy spec 'lerobot:{tmp_path}': bad argument: "
        "load_lerobot_policy() got an unexpected keyword argument 'temperature'"
    )


def test_what_the_lerobot_loader_returns_is_checked_as_a_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LeRobot is not installed here: the adapter's loader is replaced by one that returns a shipped
    policy (the arguments it gets recorded), so what ``lerobot:PATH`` does with its result is seen."""
    import rollserve.adapters.lerobot as adapter

    calls: list[tuple[str, dict[str, Any]]] = []

    def loader(path: str, **kwargs: Any) -> EchoPolicy:
        calls.append((path, kwargs))
        return EchoPolicy(state_dim=2, action_names=("a",), camera_names=(), **kwargs)

    monkeypatch.setattr(adapter, "load_lerobot_policy", loader)
    policy = load_policy(f"lerobot:{tmp_path}", chunk_size=4)
    assert isinstance(policy, EchoPolicy) and policy.metadata.chunk_size == 4
    assert calls == [(str(tmp_path), {"chunk_size": 4})]
    assert _policy_error(f"lerobot:{tmp_path}", chunk_size=0) == (
        f"policy spec 'lerobot:{tmp_path}': metadata needs chunk_size >= 1 and action names"
    )


def test_a_dotted_attribute_is_followed_part_by_part() -> None:
    """``module:obj.attr`` names an attribute of an attribute (here the module's own submodule)."""
    policy = load_policy("rollserve.models:simple_policies.chunk_policy", chunk_size=4)
    assert isinstance(policy, ChunkPolicy) and policy.metadata.chunk_size == 4
    assert _policy_error(f"{SIMPLE}:ChunkPolicy.no_such_qx") == (
        f"policy spec '{SIMPLE}:ChunkPolicy.no_such_qx': '{SIMPLE}' has no attribute 'ChunkPolicy.no_such_qx'"
    )


def test_a_missing_attribute_names_the_module_and_the_attribute() -> None:
    """The module was found; the message says which name in it was not."""
    assert _policy_error(f"{SIMPLE}:no_such_factory_qx") == (
        f"policy spec '{SIMPLE}:no_such_factory_qx': '{SIMPLE}' has no attribute 'no_such_factory_qx'"
    )


def test_a_class_with_class_level_metadata_is_a_factory(modules: Callable[[str, str], str]) -> None:
    """A class carries its ``metadata`` like an instance does; it is called, not served as is."""
    modules(
        "class_policy_qx",
        "from rollserve.models.simple_policies import EchoPolicy\n"
        "class Policy(EchoPolicy):\n"
        "    metadata = EchoPolicy(state_dim=2, action_names=('a',), camera_names=()).metadata\n"
        "    def __init__(self, width=1):\n"
        "        super().__init__(state_dim=width, action_names=('a',) * width, camera_names=())\n",
    )
    policy = load_policy("class_policy_qx:Policy", width=3)
    assert not isinstance(policy, type) and policy.metadata.action_dim == 3


def test_a_ready_policy_object_takes_no_arguments(modules: Callable[[str, str], str]) -> None:
    """A module-level policy is served as it is; ``--policy-arg`` could not reach it, so it is refused."""
    modules(
        "ready_policy_qx",
        "from rollserve.models.simple_policies import ChunkPolicy\nPOLICY = ChunkPolicy()\n",
    )
    ready = importlib.import_module("ready_policy_qx")
    assert load_policy("ready_policy_qx:POLICY") is ready.POLICY
    assert _policy_error("ready_policy_qx:POLICY", seed=1) == (
        "policy spec 'ready_policy_qx:POLICY' names a policy object; it takes no arguments"
    )


def test_a_ready_policy_object_is_checked_as_a_factorys_result_is(
    modules: Callable[[str, str], str],
) -> None:
    """A ready object gets the same checks as a factory's result, under its own spec."""
    modules(
        "empty_policy_qx",
        "from rollserve.models.simple_policies import echo_policy\nEMPTY = echo_policy(chunk_size=0)\n",
    )
    assert _policy_error("empty_policy_qx:EMPTY") == (
        "policy spec 'empty_policy_qx:EMPTY': metadata needs chunk_size >= 1 and action names"
    )


def test_an_attribute_that_is_neither_says_so() -> None:
    """A constant is neither called nor served."""
    assert _policy_error(f"{SIMPLE}:DROID_CAMERAS") == (
        f"policy spec '{SIMPLE}:DROID_CAMERAS': 'DROID_CAMERAS' is neither a factory nor a policy"
    )


def test_a_factory_gets_its_arguments_and_its_failure_is_named() -> None:
    """``--policy-arg``s reach the factory; its own error is named with the factory that raised it."""
    policy = load_policy(f"{SIMPLE}:echo_policy", layout="droid", chunk_size=3)
    assert isinstance(policy, EchoPolicy)
    assert (policy.metadata.chunk_size, policy.metadata.action_dim) == (3, 8)
    assert _policy_error(f"{SIMPLE}:echo_policy", layout="aloha") == (
        f"policy spec '{SIMPLE}:echo_policy': calling echo_policy() failed: "
        "ValueError: layout must be one of ['droid', 'libero'], got 'aloha'"
    )


# -- what a loaded policy must be -------------------------------------------------------------------


def test_a_factory_that_returns_no_policy_names_the_type() -> None:
    """What the factory returned is named by its type."""
    assert _policy_error(f"{SIMPLE}:RTCConfig") == (
        f"policy spec '{SIMPLE}:RTCConfig' returned RTCConfig, which has no PolicyMetadata 'metadata'"
    )


def test_metadata_without_predict_action_chunk_is_refused(modules: Callable[[str, str], str]) -> None:
    """Metadata alone is no policy: the server would fail at the first request."""
    modules(
        "no_predict_qx",
        "from rollserve.models.simple_policies import droid_policy\n"
        "class Half:\n"
        "    metadata = droid_policy().metadata\n"
        "def make():\n"
        "    return Half()\n",
    )
    assert _policy_error("no_predict_qx:make") == (
        "policy spec 'no_predict_qx:make' returned Half without predict_action_chunk()"
    )


@pytest.mark.parametrize(
    "kwargs", [{"chunk_size": 0}, {"action_names": ()}, {"chunk_size": 0, "action_names": ()}]
)
def test_an_empty_chunk_or_no_actions_is_refused(kwargs: dict[str, Any]) -> None:
    """A policy with no chunk rows or no actions could answer nothing; either alone is refused."""
    assert _policy_error(f"{SIMPLE}:echo_policy", **kwargs) == (
        f"policy spec '{SIMPLE}:echo_policy': metadata needs chunk_size >= 1 and action names"
    )


def test_a_chunk_of_one_action_of_one_is_a_policy() -> None:
    """The smallest policy the rule allows loads."""
    policy = load_policy(f"{SIMPLE}:echo_policy", chunk_size=1, action_names=("gripper",))
    assert (policy.metadata.chunk_size, policy.metadata.action_dim) == (1, 1)


def test_batching_declared_without_predict_action_chunks_is_refused(
    modules: Callable[[str, str], str],
) -> None:
    """The batcher would call ``predict_action_chunks``; declaring batching without it is refused."""
    source = (
        "import dataclasses\n"
        "from rollserve.models.simple_policies import EchoPolicy\n"
        "class OneAtATime:\n"
        "    def __init__(self, batching):\n"
        "        echo = EchoPolicy(state_dim=2, action_names=('a',), camera_names=())\n"
        "        self.metadata = dataclasses.replace(echo.metadata, supports_batching=batching)\n"
        "        self.predict_action_chunk = echo.predict_action_chunk\n"
    )
    modules("one_at_a_time_qx", source)
    assert _policy_error("one_at_a_time_qx:OneAtATime", batching=True) == (
        "policy spec 'one_at_a_time_qx:OneAtATime' declares batching but has no predict_action_chunks()"
    )
    assert load_policy("one_at_a_time_qx:OneAtATime", batching=False).metadata.supports_batching is False


# -- world specs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["nonsense", "pkg.module:", ":factory", "Toy"])
def test_an_unknown_world_lists_the_choices(spec: str) -> None:
    """Neither a built-in name nor ``module:factory``: the message lists what ``--world`` takes."""
    choices = "use sim, learned, video, toy or module.path:factory"
    assert _world_error(spec) == f"unknown world {spec!r}: {choices}"
    with pytest.raises(WorldLoadError):
        world_builder(spec)  # refused when resolved


def test_a_world_spec_is_resolved_before_it_is_built() -> None:
    """A Serve deployment resolves the spec once and builds a fresh world on each replica."""
    with pytest.raises(WorldLoadError, match="no attribute"):
        world_builder("rollserve.models.worlds:NoSuchWorldQx")
    build = world_builder(TOY)
    first, second = build(), build()
    assert isinstance(first, ToyWorld) and first is not second


def test_a_world_spec_splits_at_its_first_colon() -> None:
    """The module is what precedes the first colon; the rest is looked up in it."""
    assert _world_error(f"{TOY}:extra") == (
        "world spec 'rollserve.models.worlds:ToyWorld:extra': 'rollserve.models.worlds' has no attribute "
        "'ToyWorld:extra'"
    )


def test_a_world_attribute_that_is_missing_or_no_factory_is_named() -> None:
    """The module was found; the message says what is wrong with the name in it."""
    assert _world_error("rollserve.models.worlds:NoSuchWorldQx") == (
        "world spec 'rollserve.models.worlds:NoSuchWorldQx': 'rollserve.models.worlds' has no attribute "
        "'NoSuchWorldQx'"
    )
    assert _world_error("rollserve.models.worlds:WORLD_MODULES") == (
        "world spec 'rollserve.models.worlds:WORLD_MODULES': 'WORLD_MODULES' is not a factory"
    )


def test_a_world_factory_gets_the_world_args(modules: Callable[[str, str], str]) -> None:
    """``--world-arg``s reach a spec world's factory; one it does not take is named."""
    modules(
        "goal_world_qx",
        "from rollserve.models.worlds import ToyWorld\n"
        "class Stiff(ToyWorld):\n"
        "    def __init__(self, gain=0.5):\n"
        "        self.gain = gain\n",
    )
    world = load_world("goal_world_qx:Stiff", gain=1.0)
    assert isinstance(world, ToyWorld) and world.gain == 1.0
    assert _world_error("goal_world_qx:Stiff", stiffness=2) == (
        "world spec 'goal_world_qx:Stiff': calling Stiff() failed: "
        "TypeError: Stiff.__init__() got an unexpected keyword argument 'stiffness'"
    )


def test_a_factory_returning_no_world_is_a_not_a_world_error() -> None:
    """Also a ``TypeError``, as this error always was."""
    with pytest.raises(NotAWorldError) as info:
        load_world(f"{SIMPLE}:droid_policy")
    assert str(info.value) == (
        f"world spec '{SIMPLE}:droid_policy' returned ChunkPolicy, which is not a WorldModel"
    )
    assert isinstance(info.value, TypeError)


def test_built_in_world_args_are_checked_by_name() -> None:
    """Arguments are checked before anything loads; the first unknown one (sorted) is named."""
    assert _world_error("video", path="x", depth=2) == (
        "world 'video' takes no argument 'depth' (--world-arg); it takes path"
    )
    assert _world_error("sim", camera="a", alpha=1) == (
        "world 'sim' takes no argument 'alpha' (--world-arg); it takes none"
    )


def test_a_built_in_world_from_a_folder_that_is_no_checkpoint(tmp_path: Path) -> None:
    """``--world-arg path=DIR`` naming a folder without a checkpoint: the loader's error, named."""
    message = _world_error("learned", path=str(tmp_path))
    prefix = "world spec 'learned': calling load_default() failed: FileNotFoundError: "
    assert message.startswith(prefix) and str(tmp_path) in message


def test_a_built_in_world_from_a_copied_checkpoint(tmp_path: Path) -> None:
    """``--world-arg path=DIR`` loads the checkpoint from that folder."""
    folder = shutil.copytree(learned_dir(), tmp_path / "copy")
    world = load_world("learned", path=str(folder))
    assert isinstance(world, LearnedWorld)


def test_the_built_in_worlds_by_name() -> None:
    """The names ``--world`` documents load their worlds."""
    assert isinstance(load_world("toy"), ToyWorld)
    assert isinstance(load_world("learned"), LearnedWorld)


# -- check_world_dependencies -----------------------------------------------------------------------


class _Missing:
    """Hides ``names`` from ``importlib.util.find_spec`` as an install without them would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch

    def __call__(self, *names: str) -> None:
        for name in names:
            self.monkeypatch.setitem(sys.modules, name, None)  # find_spec: None, as if not installed


def test_the_missing_modules_and_their_extras_are_named_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every missing module is named, and each extra once (torch: server; the simulator's: sim)."""
    missing = _Missing(monkeypatch)
    missing("torch", "mujoco", "gymnasium")
    with pytest.raises(WorldLoadError) as info:
        check_world_dependencies("video")
    assert str(info.value) == (
        "world 'video' needs torch, mujoco, gymnasium, not installed here: "
        'pip install "rollserve[server,sim]" (or "rollserve[all]")'
    )
    with pytest.raises(WorldLoadError) as info:
        check_world_dependencies("learned")
    assert str(info.value) == (
        "world 'learned' needs torch, not installed here: "
        'pip install "rollserve[server]" (or "rollserve[all]")'
    )


def test_a_module_present_without_a_spec_counts_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in module (``__spec__`` None) is no install of the simulator: ``find_spec`` raises
    ``ValueError`` for it, which is read as not installed."""
    monkeypatch.setitem(sys.modules, "gymnasium_robotics", types.ModuleType("gymnasium_robotics"))
    with pytest.raises(WorldLoadError) as info:
        check_world_dependencies("sim")
    assert str(info.value).startswith("world 'sim' needs gymnasium_robotics, not installed here")


def test_worlds_with_their_modules_or_without_any_pass() -> None:
    """Installed here: nothing to refuse; a spec world is checked when it is imported."""
    for spec in ("toy", "sim", "learned", "video", TOY, "no_such_module_qx:make"):
        check_world_dependencies(spec)  # spec worlds are checked when they are imported


# -- the toy world ----------------------------------------------------------------------------------


def _toy_start(seed: int) -> np.ndarray:
    """The toy world's first observation from ``seed`` (its rule, written out here)."""
    rng = np.random.default_rng(seed)
    joints, target = rng.uniform(-0.5, 0.5, 7), rng.uniform(-0.9, 0.9, 7)
    return np.concatenate([joints, [0.0], target]).astype(np.float32)


def test_toy_starts_from_its_seed_frozen_float32() -> None:
    """The seeded start follows the toy's rule; its arrays are float32 and read-only, as a state must be."""
    (out,) = ToyWorld().initial_states([WorldInit(seed=11)])
    np.testing.assert_array_equal(out.observation, _toy_start(11))
    for array in (out.state, out.observation):
        assert array.dtype == np.float32 and not array.flags.writeable


def test_toy_start_state_is_checked_then_rounded() -> None:
    """A start state is checked as sent (float64), then rounded; a wrong size or a value past a
    bound is refused."""
    sent = np.linspace(-1.0, 1.0, 15)
    good, short, past, nan = ToyWorld().initial_states(
        [
            WorldInit(state=sent),
            WorldInit(state=sent[:14]),
            WorldInit(state=np.append(sent[:14], 1.0 + 2.0**-52)),
            WorldInit(state=np.append(sent[:14], np.nan)),
        ]
    )
    np.testing.assert_array_equal(good.observation, sent.astype(np.float32))
    assert good.state.dtype == np.float32 and not good.state.flags.writeable
    assert isinstance(short, ValueError) and str(short) == "toy start state must have 15 values"
    assert isinstance(past, ValueError) and "is above observation_high 1.0" in str(past)
    assert isinstance(nan, ValueError) and "is not a number" in str(nan)


def test_toy_start_state_may_be_any_shape_of_15_values() -> None:
    """The state is flattened as sent: 15 values in any shape."""
    sent = np.zeros((3, 5))
    (out,) = ToyWorld().initial_states([WorldInit(state=sent)])
    assert out.observation.shape == (15,)


def test_toy_step_follows_its_rule() -> None:
    """Joints and gripper halfway to the clipped action; reward minus the distance to the target;
    terminated within 0.05 of it; one output per step, in order."""
    world = ToyWorld()
    starts = [_toy_start(1), _toy_start(2)]
    actions = [np.array([2.0, -3.0, 0.1, 0.2, -0.2, 0.5, -0.5, -1.0]), np.full(8, 0.25)]
    outs = world.step_batch([WorldStep(s, a) for s, a in zip(starts, actions, strict=True)])
    for start, action, out in zip(starts, actions, outs, strict=True):
        expected = moved(start, action)
        np.testing.assert_allclose(out.observation, expected, rtol=0, atol=1e-7)
        distance = float(np.linalg.norm(expected[:7] - expected[8:15]))
        assert out.reward == pytest.approx(-distance, abs=1e-6) and out.terminated is False
        assert out.state.dtype == np.float32 and not out.state.flags.writeable
    assert world.step_batch([]) == []


def test_toy_takes_an_action_as_its_float32_rounding() -> None:
    """The toy world's actions are float32 (its action space): an action handed as float64 steps
    exactly as the float32 action it rounds to."""
    rng = np.random.default_rng(5)
    start = _toy_start(5)
    actions = rng.uniform(-1.0, 1.0, (64, 8))
    world = ToyWorld()
    wide = world.step_batch([WorldStep(start, a) for a in actions])
    narrow = world.step_batch([WorldStep(start, a.astype(np.float32)) for a in actions])
    for a, b in zip(wide, narrow, strict=True):
        np.testing.assert_array_equal(np.asarray(a.observation), np.asarray(b.observation))
        assert a.reward == b.reward


def test_toy_terminates_inside_the_radius_only() -> None:
    """Joints resting 0.04 from the target (inside 0.05) end the episode; 0.05 itself (as float32,
    the world's dtype) and 0.06 do not."""
    for distance, ends in ((0.04, True), (0.05, False), (0.06, False)):
        state = np.zeros(15, np.float32)
        state[8] = distance  # target_0; every joint stays at 0 under a zero action
        (out,) = ToyWorld().step_batch([WorldStep(state, np.zeros(8, np.float32))])
        assert out.terminated is ends, distance
        assert out.reward == pytest.approx(-distance)
