"""A learned *video* world model of the tabletop task: camera frames in, imagined camera frames out.

The network (``VideoWorldNet``) has three parts and a real latent:

- an encoder maps the exterior camera frame (``3 x 64 x 64``) to a latent ``z`` (``C x 8 x 8``);
- latent dynamics advance ``z`` one control step, conditioned on the robot state and the executed
  action (FiLM), and a state head advances the 13-number state with the same inputs;
- a decoder turns ``z`` (and the state) back into a frame.

The world is functional like the others: a session's state is ``(z, state vector)``, a step never
mutates it, and ``batch_step`` over many sessions is one batched forward pass. Starts are the
simulator's (the start frame is rendered once from the seed, as a robot's first camera frame would
be given); every later frame is imagined. ``video_latent`` is ``z`` itself, ``[1, C, 8, 8]``.
Checkpoint: ``model.safetensors`` + ``config.json`` (no pickle).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rollserve.models.learned_world import StartDistribution, TaskRule, check_task_config
from rollserve.models.net_checkpoint import load_net_weights, read_net_config, save_net
from rollserve.models.world import (
    DROID_ACTION_NAMES,
    RenderSpec,
    WorldInit,
    WorldOutput,
    WorldSpec,
    WorldStep,
)

FORMAT = "rollserve.video_world_model"
FORMAT_VERSION = 1
LATENT_BOUND = 50.0
"""Latents of real frames stay within about +-13; predictions are clamped to +-50."""
STATE_BOUND = 4.0
"""Joint angles (rad) and positions (m) of this task stay well inside +-4 (as in the sim world)."""


@dataclass(frozen=True)
class VideoWorldConfig:
    """Everything a checkpoint needs besides its weights."""

    state_names: tuple[str, ...]
    action_names: tuple[str, ...] = DROID_ACTION_NAMES
    camera: str = "exterior"
    image_size: int = 64
    latent_channels: int = 16
    width: int = 64
    dynamics_width: int = 48
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
    def action_dim(self) -> int:
        return len(self.action_names)

    @property
    def latent_side(self) -> int:
        return self.image_size // 8

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        return (self.latent_channels, self.latent_side, self.latent_side)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VideoWorldConfig:
        data = dict(data)
        for key in ("state_names", "action_names", "action_low", "action_high"):
            data[key] = tuple(data[key])
        if data.get("start") is not None:
            data["start"] = StartDistribution(
                **{k: tuple(v) if isinstance(v, list) else v for k, v in data["start"].items()}
            )
        if data.get("rule") is not None:
            data["rule"] = TaskRule(**data["rule"])
        return cls(**data)


def _coords(batch: int, side: int, like: torch.Tensor) -> torch.Tensor:
    """Two channels of x/y position in [-1, 1], so convolutions know where they are (CoordConv)."""
    return _grid(side, like.dtype, like.device).expand(batch, -1, -1, -1)


@functools.lru_cache(maxsize=16)
def _grid(side: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The ``(1, 2, side, side)`` position grid, made once: building it took five small ops (~30 µs)
    on every step. Made outside inference mode and without grad, so training can use it too."""
    with torch.inference_mode(False), torch.no_grad():
        axis = torch.linspace(-1.0, 1.0, side, dtype=dtype, device=device)
        return torch.stack(torch.meshgrid(axis, axis, indexing="ij")).unsqueeze(0)


class VideoWorldNet(nn.Module):
    """Encoder, state/action-conditioned latent dynamics, state head and decoder."""

    def __init__(self, config: VideoWorldConfig) -> None:
        super().__init__()
        self.config = config
        c, w, d = config.latent_channels, config.width, config.dynamics_width
        s, a = config.state_dim, config.action_dim
        # Pixel (un)shuffle moves between 64x64x3 and 16x16x48 for free, so no layer runs at full
        # resolution: the net stays cheap enough to train on two CPU cores.
        self.encoder = nn.Sequential(
            nn.PixelUnshuffle(4),
            nn.Conv2d(48, 32, 3, 1, 1),
            nn.SiLU(),
            nn.Conv2d(32, w, 4, 2, 1),
            nn.SiLU(),
            nn.Conv2d(w, c, 1),
        )
        cond_in = s + a + a  # state, action, and action relative to the measured joints/gripper
        self.condition = nn.Sequential(nn.Linear(cond_in, 128), nn.SiLU(), nn.Linear(128, 2 * d))
        self.dyn_in = nn.Conv2d(c + 2, d, 3, 1, 1)
        self.dyn_body = nn.Sequential(
            nn.SiLU(), nn.Conv2d(d, d, 3, 1, 1), nn.SiLU(), nn.Conv2d(d, c, 3, 1, 1)
        )
        self.latent_summary = nn.Linear(c * config.latent_side**2, 64)
        self.state_head = nn.Sequential(
            nn.Linear(cond_in + 64, 256), nn.SiLU(), nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, s)
        )
        self.decoder_state = nn.Linear(s, 16)
        self.decoder = nn.Sequential(
            nn.Conv2d(c + 2 + 16, w, 3, 1, 1),
            nn.SiLU(),
            nn.ConvTranspose2d(w, 32, 4, 2, 1),
            nn.SiLU(),
            nn.Conv2d(32, 48, 3, 1, 1),
            nn.PixelShuffle(4),
        )
        for name, size in (("state", s), ("action", a), ("delta", s)):
            self.register_buffer(f"{name}_mean", torch.zeros(size))
            self.register_buffer(f"{name}_std", torch.ones(size))

    # -- parts ------------------------------------------------------------------------------------
    def encode(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames ``(B, 3, H, W)`` in [0, 1] -> latents ``(B, C, H/8, W/8)``."""
        return self.encoder(frames * 2.0 - 1.0)

    def decode(self, latent: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Latents (and the state they belong to) -> frames in [0, 1]."""
        b, _, h, w = latent.shape
        emb = self.decoder_state(self._norm_state(state))[:, :, None, None].expand(-1, -1, h, w)
        x = torch.cat([latent, _coords(b, h, latent), emb], dim=1)
        return torch.sigmoid(self.decoder(x))

    def step(
        self, latent: torch.Tensor, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One control step: ``(z, state, action) -> (z', state')``."""
        cond = torch.cat(
            [
                self._norm_state(state),
                (action - self.action_mean) / self.action_std,
                (action - state[:, : self.config.action_dim]) / self.action_std,
            ],
            dim=1,
        )
        gamma, beta = self.condition(cond).chunk(2, dim=1)
        b, _, h, _ = latent.shape
        hidden = self.dyn_in(torch.cat([latent, _coords(b, h, latent)], dim=1))
        hidden = hidden * (1.0 + gamma[:, :, None, None]) + beta[:, :, None, None]
        next_latent = latent + self.dyn_body(hidden)
        summary = self.latent_summary(latent.flatten(1))
        delta = self.state_head(torch.cat([cond, summary], dim=1)) * self.delta_std + self.delta_mean
        return next_latent, state + delta

    def _norm_state(self, state: torch.Tensor) -> torch.Tensor:
        return (state - self.state_mean) / self.state_std


@dataclass(frozen=True)
class VideoState:
    """A session's state in the video world: the latent and the state vector (both read-only), and
    whether the session wants the decoded frames (decoding is skipped for sessions that don't)."""

    latent: np.ndarray
    vector: np.ndarray
    render: bool = False

    @classmethod
    def of(cls, latent: np.ndarray, vector: np.ndarray, render: bool = False) -> VideoState:
        z, s = np.array(latent, dtype=np.float32, order="C"), np.array(vector, dtype=np.float32, order="C")
        z.flags.writeable = s.flags.writeable = False
        return cls(z, s, render)


def transpose_linear_weights(net: nn.Module) -> None:
    """Store every ``nn.Linear`` weight ``(out, in)`` as the transpose of a row-major ``(in, out)``
    array, in place. ``F.linear`` multiplies by ``weight.t()``, which is then row-major: MKL's
    sgemm takes its plain path, 1.5-3x faster for these small layers on a 32-row batch (the
    1024 -> 64 latent summary: ~160 -> ~50 µs). Same values; the outputs are the same to float
    rounding (bit for bit from 16 rows on this machine, ~1e-6 apart below: MKL sums small batches
    in another order), as with the channels-last convolutions."""
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, nn.Linear):
                module.weight.data = module.weight.data.t().contiguous().t()


def _frozen_copy(array: np.ndarray) -> np.ndarray:
    """A read-only copy of one row of a batch (a view would keep the whole batch alive)."""
    copy = array.copy()
    copy.flags.writeable = False
    return copy


def frames_to_uint8(frames: np.ndarray) -> np.ndarray:
    """``(B, 3, H, W)`` floats in [0, 1] -> ``(B, H, W, 3)`` uint8 RGB images."""
    return np.ascontiguousarray(
        (np.clip(frames, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8).transpose(0, 2, 3, 1)
    )


def decoded_to_images(decoded: torch.Tensor) -> np.ndarray:
    """:func:`frames_to_uint8` for the decoder's fresh output tensor, computed in place in torch:
    bit-identical (pinned by a test), ~0.5 ms less per 32 frames. ``decoded`` is overwritten."""
    pixels = decoded.clamp_(0.0, 1.0).mul_(255.0).add_(0.5).to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).contiguous().numpy()


def uint8_to_frames(images: np.ndarray) -> np.ndarray:
    """``(B, H, W, 3)`` uint8 RGB -> ``(B, 3, H, W)`` float32 in [0, 1]."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32) / 255.0


class VideoWorld:
    """The trained video world behind the rollout API (batched: one forward pass per engine batch).

    ``observation`` (what goes out as ``video_latent``) is the latent ``[1, C, h, w]``; the decoded
    frame is in ``images`` under the camera's name, and the state head's prediction in ``vector``.
    """

    def __init__(self, net: VideoWorldNet, name: str = "video") -> None:
        # channels-last weights: oneDNN's convolutions run ~25% faster on them on CPU (same values to
        # ~1e-6; outputs are made C-contiguous again before they leave the world)
        self.net = net.eval().to(memory_format=torch.channels_last)
        transpose_linear_weights(self.net)
        cfg = net.config
        check_task_config(cfg)
        self.config = cfg
        latent_size = int(np.prod(cfg.latent_shape))
        self.spec = WorldSpec(
            name=name,
            observation_names=tuple(f"z{i}" for i in range(latent_size)),
            action_names=cfg.action_names,
            action_low=cfg.action_low or None,
            action_high=cfg.action_high or None,
            # the bounds predict() clamps to, published so clients build finite spaces
            observation_low=(-LATENT_BOUND,) * latent_size,
            observation_high=(LATENT_BOUND,) * latent_size,
            state_low=(-STATE_BOUND,) * cfg.state_dim,
            state_high=(STATE_BOUND,) * cfg.state_dim,
            fps=cfg.control_hz,
            max_episode_steps=cfg.max_episode_steps,
            description=(
                f"learned video world model of the tabletop task: {cfg.image_size}x{cfg.image_size} "
                f"{cfg.camera} frames, latent {list(cfg.latent_shape)}"
            ),
            aliases=("video_world",),
            state_names=cfg.state_names,
            cameras=(cfg.camera,),
            observation_shape=(1, *cfg.latent_shape),
            frame_size=(cfg.image_size, cfg.image_size),
        )
        self._low = np.asarray(cfg.action_low, dtype=np.float32) if cfg.action_low else None
        self._high = np.asarray(cfg.action_high, dtype=np.float32) if cfg.action_high else None
        self._renderer: Any = None

    # -- starts ---------------------------------------------------------------------------------------
    def initial_states(self, inits: Sequence[WorldInit]) -> list[WorldOutput | BaseException]:
        outs: list[WorldOutput | BaseException] = []
        for init in inits:
            try:
                if init.state is not None:
                    raise ValueError("the video world starts from a seed (its start frame is rendered)")
                self._check_render(init.render)
                frame, vector = self._start_frame(init.seed)
                outs.append(self._start(frame, vector, init.render is not None))
            except Exception as exc:
                outs.append(exc)
        return outs

    def _start_frame(self, seed: int | None) -> tuple[np.ndarray, np.ndarray]:
        """The simulator's start frame and state for ``seed`` (what ``env.reset(seed)`` shows)."""
        if self._renderer is None:
            from rollserve.sim.env import TabletopPickPlaceEnv

            size = (self.config.image_size, self.config.image_size)
            self._renderer = TabletopPickPlaceEnv(image_size=size)
        obs, _ = self._renderer.reset(seed=seed)
        image = self._renderer.render_cameras()[self.config.camera]
        return image, obs["state"]

    def _check_render(self, render: RenderSpec | None) -> None:
        size = (self.config.image_size, self.config.image_size)
        if render is not None and (
            render.cameras != (self.config.camera,) or (render.height, render.width) != size
        ):
            raise ValueError(f"the video world renders only {self.config.camera!r} at {size[0]}x{size[1]}")

    @torch.inference_mode()
    def _start(self, image: np.ndarray, vector: np.ndarray, render: bool) -> WorldOutput:
        """The start frame's latent; a rendering session sees the frame as the model reconstructs it."""
        latent = self.net.encode(torch.as_tensor(uint8_to_frames(image[None])))
        state = VideoState.of(latent[0].numpy(), vector, render)
        images = None
        if render:
            decoded = self.net.decode(latent, torch.as_tensor(vector[None], dtype=torch.float32))
            images = {self.config.camera: decoded_to_images(decoded)[0]}
        return WorldOutput(state=state, observation=state.latent[None], vector=state.vector, images=images)

    # -- steps ----------------------------------------------------------------------------------------
    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        """Every well-formed step in one batched forward pass; a malformed one fails alone."""
        outs: list[WorldOutput | BaseException | None] = [None] * len(steps)
        actions = self._all_actions(steps)
        if actions is not None:  # the common case: every item well-formed, checked in one go
            good = list(range(len(steps)))
        else:
            good = []
            for i, step in enumerate(steps):
                problem = self._problem(step)
                if problem is None:
                    good.append(i)
                else:
                    outs[i] = problem
            if not good:
                return outs  # type: ignore[return-value]
            actions = np.stack([np.asarray(steps[i].action, dtype=np.float32) for i in good])
        states: list[VideoState] = [steps[i].state for i in good]
        latents = np.stack([state.latent for state in states])
        vectors = np.stack([state.vector for state in states])
        if self._low is not None and self._high is not None:
            actions = np.clip(actions, self._low, self._high)
        want_frames = np.array([state.render for state in states], dtype=bool)
        next_latents, next_vectors, frames = self.predict(latents, vectors, actions, want_frames)
        rule = self.config.rule
        success = rule.success(next_vectors)  # type: ignore[union-attr]
        rewards = rule.reward(next_vectors, success).tolist()  # type: ignore[union-attr]
        camera = self.config.camera
        for row, (i, render, done) in enumerate(
            zip(good, want_frames.tolist(), success.tolist(), strict=True)
        ):
            state = VideoState(_frozen_copy(next_latents[row]), _frozen_copy(next_vectors[row]), render)
            outs[i] = WorldOutput(
                state=state,
                observation=state.latent[None],
                reward=rewards[row],
                terminated=done,
                info={"success": done},
                vector=state.vector,
                images={camera: frames[row]} if render and frames is not None else None,
            )
        return outs  # type: ignore[return-value]

    def _all_actions(self, steps: Sequence[WorldStep]) -> np.ndarray | None:
        """Every step's action as one ``(n, action_dim)`` float32 array when all ``n`` steps pass
        :meth:`_problem` (one numpy conversion instead of ``n``), else None: then each is checked
        alone. Whatever converts differently here (ragged, None, a wrong shape) fails the checks."""
        if not steps or not all(type(step.state) is VideoState for step in steps):
            return None
        try:
            actions = np.array([step.action for step in steps], dtype=np.float32)
        except (TypeError, ValueError):
            return None
        if actions.shape != (len(steps), self.config.action_dim) or not np.isfinite(actions).all():
            return None
        return actions

    def _problem(self, step: WorldStep) -> BaseException | None:
        if not isinstance(step.state, VideoState):
            return TypeError(f"not a video-world state: {type(step.state).__name__}")
        action = np.asarray(step.action, dtype=np.float32) if step.action is not None else None
        if action is None or action.shape != (self.config.action_dim,) or not np.all(np.isfinite(action)):
            return ValueError(f"the video world takes {self.config.action_dim} finite action values")
        return None

    @torch.inference_mode()
    def predict(
        self,
        latents: np.ndarray,
        vectors: np.ndarray,
        actions: np.ndarray,
        want_frames: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """One batched step; frames (uint8 HWC) are decoded only for the rows that want them."""
        z, s = self.net.step(torch.as_tensor(latents), torch.as_tensor(vectors), torch.as_tensor(actions))
        # far outside the training data a rollout can diverge; keep it finite (and nonsense)
        z = z.nan_to_num_().clamp_(-LATENT_BOUND, LATENT_BOUND)
        s = s.nan_to_num_().clamp_(-STATE_BOUND, STATE_BOUND)
        frames = None
        rows = np.arange(len(latents)) if want_frames is None else np.flatnonzero(want_frames)
        if 0 < len(rows) == len(latents):  # every row renders: no gather, no scatter
            frames = decoded_to_images(self.net.decode(z, s))
        elif len(rows):
            decoded = decoded_to_images(self.net.decode(z[rows], s[rows]))
            frames = np.zeros((len(latents), *decoded.shape[1:]), dtype=np.uint8)
            frames[rows] = decoded
        return z.contiguous().numpy(), s.numpy(), frames

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


def default_checkpoint_dir() -> Path:
    """The video world shipped inside the package."""
    return Path(str(resources.files("rollserve") / "checkpoints" / "video_world"))


def save_video_world(net: VideoWorldNet, path: str | Path) -> Path:
    return save_net(net, net.config, path, fmt=FORMAT, version=FORMAT_VERSION)


def load_video_world_net(path: str | Path) -> VideoWorldNet:
    data = read_net_config(path, fmt=FORMAT, version=FORMAT_VERSION)
    return load_net_weights(VideoWorldNet(VideoWorldConfig.from_dict(data)), path).eval()


def load_default(path: str | Path | None = None) -> VideoWorld:
    """The shipped video world (``rollserve serve --world video``)."""
    return VideoWorld(load_video_world_net(path or default_checkpoint_dir()))
