"""A learned world model of the tabletop task: an ensemble of MLPs trained on simulator transitions.

Each member maps (state, last state change, action) to the next state change; the world steps with
the ensemble mean (deterministic) and reports the members' spread as ``uncertainty``. Reward and
success follow the task's own rule applied to the predicted state, as model-based RL does with a
known reward. Starts are drawn exactly as the simulator draws them, so one seed means one layout in
both worlds. Checkpoint: ``model.safetensors`` + ``config.json`` (no pickle).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rollserve.models.net_checkpoint import load_net_weights, read_net_config, save_net
from rollserve.models.world import (
    DROID_ACTION_NAMES,
    WorldInit,
    WorldOutput,
    WorldSpec,
    WorldStep,
    per_item,
)

FORMAT = "rollserve.world_model"
FORMAT_VERSION = 1
STATE_BOUND = 4.0
"""The published observation bounds (as the video world's). Joint angles (rad) and positions (m)
of this task stay well inside them; a rollout driven far from the training data does not, so
predictions are clamped to them and an observation is always inside ``observation_space``."""


@dataclass(frozen=True)
class StartDistribution:
    """How the task starts an episode (copied from the simulator when the model is trained)."""

    home_qpos: tuple[float, ...]
    home_noise: float
    cube_x: tuple[float, float]
    cube_y: tuple[float, float]
    target_x: tuple[float, float]
    target_y: tuple[float, float]
    cube_rest_z: float

    def sample(self, seed: int | None) -> np.ndarray:
        """The start observation ``env.reset(seed)`` produces (same generator, same draw order)."""
        rng = np.random.default_rng(seed)
        cube = [rng.uniform(*self.cube_x), rng.uniform(*self.cube_y)]
        target = [rng.uniform(*self.target_x), rng.uniform(*self.target_y)]
        home = np.asarray(self.home_qpos)
        arm = home + rng.uniform(-self.home_noise, self.home_noise, size=home.shape)
        return np.concatenate([arm, [0.0], cube, [self.cube_rest_z], target]).astype(np.float32)


@dataclass(frozen=True)
class TaskRule:
    """Success and reward of the task as functions of the state (the simulator's rule)."""

    success_radius: float
    rest_tolerance: float
    cube_rest_z: float
    success_bonus: float = 10.0

    def success(self, states: np.ndarray) -> np.ndarray:
        near = np.linalg.norm(states[:, 8:10] - states[:, 11:13], axis=1) < self.success_radius
        return near & (states[:, 10] < self.cube_rest_z + self.rest_tolerance)

    def reward(self, states: np.ndarray, success: np.ndarray) -> np.ndarray:
        return -np.linalg.norm(states[:, 8:10] - states[:, 11:13], axis=1) + self.success_bonus * success


@dataclass(frozen=True)
class LearnedWorldConfig:
    """Everything a checkpoint needs besides its weights."""

    state_names: tuple[str, ...]
    action_names: tuple[str, ...] = DROID_ACTION_NAMES
    hidden: int = 256
    depth: int = 2
    ensemble: int = 5
    control_hz: float = 10.0
    max_episode_steps: int = 120
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    start: StartDistribution | None = None
    rule: TaskRule | None = None
    training: dict[str, Any] = field(default_factory=dict)

    @property
    def state_dim(self) -> int:
        return len(self.state_names)

    @property
    def input_dim(self) -> int:
        return 2 * self.state_dim + 2 * len(self.action_names)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LearnedWorldConfig:
        data = dict(data)
        for key in ("state_names", "action_names", "action_low", "action_high"):
            data[key] = tuple(data[key])
        start = data.get("start")
        if start is not None:
            start = {k: tuple(v) if isinstance(v, list) else v for k, v in start.items()}
            data["start"] = StartDistribution(**start)
        if data.get("rule") is not None:
            data["rule"] = TaskRule(**data["rule"])
        return cls(**data)


def check_task_config(cfg: Any) -> None:
    """Raise ``ValueError`` unless a world checkpoint's task fits its layouts: numpy would broadcast
    a one-value action bound over every action, and a short home pose starts every session with a
    state shorter than its layout, both without a word."""
    if cfg.start is None or cfg.rule is None:
        raise ValueError("checkpoint lacks the task's start distribution or rule")
    for name in ("action_low", "action_high"):
        bound = getattr(cfg, name)
        if bound and len(bound) != len(cfg.action_names):
            raise ValueError(f"{name} has {len(bound)} values for {len(cfg.action_names)} actions")
    start = cfg.start.sample(0)
    if start.shape != (len(cfg.state_names),):
        raise ValueError(
            f"the start distribution gives {start.size} values for {len(cfg.state_names)} states"
        )


class EnsembleMLP(nn.Module):
    """``ensemble`` independent MLPs evaluated together: input ``(E, B, in)`` -> ``(E, B, out)``."""

    def __init__(self, ensemble: int, inputs: int, outputs: int, hidden: int, depth: int) -> None:
        super().__init__()
        sizes = [inputs, *([hidden] * depth), outputs]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in itertools.pairwise(sizes):
            bound = 1.0 / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(torch.empty(ensemble, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.zeros(ensemble, 1, fan_out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = torch.nn.functional.silu(x)
        return x


class WorldNet(nn.Module):
    """The ensemble with its normalisation: raw (state, last change, action) in, raw change out."""

    def __init__(self, config: LearnedWorldConfig) -> None:
        super().__init__()
        self.config = config
        s, a = config.state_dim, len(config.action_names)
        self.mlp = EnsembleMLP(config.ensemble, config.input_dim, s, config.hidden, config.depth)
        self.register_buffer("in_mean", torch.zeros(config.input_dim))
        self.register_buffer("in_std", torch.ones(config.input_dim))
        self.register_buffer("out_mean", torch.zeros(s))
        self.register_buffer("out_std", torch.ones(s))
        self._action_dim = a

    def features(self, state: torch.Tensor, change: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Action relative to the measured joints/gripper is what the PD controllers act on."""
        reach = action - state[..., : self._action_dim]
        return torch.cat([state, change, action, reach], dim=-1)

    def forward(self, state: torch.Tensor, change: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Normalised change predicted by every member: ``(E, B, state_dim)``."""
        x = (self.features(state, change, action) - self.in_mean) / self.in_std
        return self.mlp(x.unsqueeze(0).expand(self.config.ensemble, -1, -1))

    def denormalise(self, out: torch.Tensor) -> torch.Tensor:
        return out * self.out_std + self.out_mean


@dataclass(frozen=True)
class LearnedState:
    """A session's state in the learned world: the observation and its last change (a velocity proxy)."""

    observation: np.ndarray
    change: np.ndarray

    @classmethod
    def of(cls, observation: np.ndarray, change: np.ndarray) -> LearnedState:
        obs, chg = np.array(observation, dtype=np.float32), np.array(change, dtype=np.float32)
        obs.flags.writeable = chg.flags.writeable = False
        return cls(obs, chg)


class LearnedWorld:
    """The trained ensemble behind the rollout API (batched: one forward pass per engine batch)."""

    def __init__(self, net: WorldNet, name: str = "learned") -> None:
        self.net = net.eval()
        cfg = net.config
        check_task_config(cfg)
        self.config = cfg
        self.spec = WorldSpec(
            name=name,
            observation_names=cfg.state_names,
            action_names=cfg.action_names,
            action_low=cfg.action_low or None,
            action_high=cfg.action_high or None,
            observation_low=(-STATE_BOUND,) * cfg.state_dim,
            observation_high=(STATE_BOUND,) * cfg.state_dim,
            fps=cfg.control_hz,
            max_episode_steps=cfg.max_episode_steps,
            description=f"learned world model of the tabletop task ({cfg.ensemble}-member MLP ensemble)",
        )
        self._low = np.asarray(cfg.action_low, dtype=np.float32) if cfg.action_low else None
        self._high = np.asarray(cfg.action_high, dtype=np.float32) if cfg.action_high else None

    def initial_states(self, inits: Sequence[WorldInit]) -> list[WorldOutput | BaseException]:
        return per_item(self._initial, inits)

    def _initial(self, init: WorldInit) -> WorldOutput:
        if init.state is not None:
            sent = np.asarray(init.state, dtype=np.float64).reshape(-1)  # as the client sent it
            if sent.shape != (self.config.state_dim,) or not np.all(np.isfinite(sent)):
                raise ValueError(f"a start state has {self.config.state_dim} finite values")
            self.spec.check_start_state(sent)  # before rounding: a value just past a bound is refused
            obs = sent.astype(np.float32)
        else:
            obs = self.config.start.sample(init.seed)  # type: ignore[union-attr]
        state = LearnedState.of(obs, np.zeros_like(obs))
        return WorldOutput(state=state, observation=state.observation)

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        if not steps:
            return []
        for step in steps:
            if not isinstance(step.state, LearnedState):
                raise TypeError(f"not a learned-world state: {type(step.state).__name__}")
        obs = np.stack([s.state.observation for s in steps])
        change = np.stack([s.state.change for s in steps])
        actions = np.stack([np.asarray(s.action, dtype=np.float32) for s in steps])
        if self._low is not None and self._high is not None:
            actions = np.clip(actions, self._low, self._high)
        nxt, spread = self.predict(obs, change, actions)
        rule = self.config.rule
        success = rule.success(nxt)  # type: ignore[union-attr]
        reward = rule.reward(nxt, success)  # type: ignore[union-attr]
        return [
            WorldOutput(
                state=LearnedState.of(nxt[i], nxt[i] - obs[i]),
                observation=nxt[i],
                reward=float(reward[i]),
                terminated=bool(success[i]),
                uncertainty=float(spread[i]),
                info={"success": bool(success[i])},
            )
            for i in range(len(steps))
        ]

    @torch.inference_mode()
    def predict(
        self, obs: np.ndarray, change: np.ndarray, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Next observations (ensemble mean, kept finite and inside the published bounds, as
        ``VideoWorld.predict`` does) and the members' spread (mean std, normalised units)."""
        t = [torch.as_tensor(x, dtype=torch.float32) for x in (obs, change, actions)]
        out = self.net(*t)
        mean = self.net.denormalise(out.mean(dim=0))
        spread = out.std(dim=0).mean(dim=-1) if out.shape[0] > 1 else torch.zeros(out.shape[1])
        nxt = (t[0] + mean).nan_to_num_().clamp_(-STATE_BOUND, STATE_BOUND)
        return nxt.numpy().astype(np.float32), spread.numpy()

    def close(self) -> None:
        pass


def default_checkpoint_dir() -> Path:
    """The learned world shipped inside the package."""
    return Path(str(resources.files("rollserve") / "checkpoints" / "world_model"))


def save_world_model(net: WorldNet, path: str | Path) -> Path:
    return save_net(net, net.config, path, fmt=FORMAT, version=FORMAT_VERSION)


def load_world_model(path: str | Path) -> WorldNet:
    data = read_net_config(path, fmt=FORMAT, version=FORMAT_VERSION)
    return load_net_weights(WorldNet(LearnedWorldConfig.from_dict(data)), path)


def load_default(path: str | Path | None = None) -> LearnedWorld:
    """The shipped learned world (``rollserve serve --world learned``)."""
    return LearnedWorld(load_world_model(path or default_checkpoint_dir()))
