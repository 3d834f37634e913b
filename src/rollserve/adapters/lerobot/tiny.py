"""Tiny random-init LeRobot checkpoints, saved by LeRobot itself, for tests and benchmarks.

Nothing comes from a hub: ACT and Diffusion get their ResNet backbone without pretrained weights,
and SmolVLA gets a small local SmolVLM (config, word-level tokenizer, image processor) written
next to the checkpoint. Each builder returns the ``pretrained_model``-style directory that
``rollserve serve --policy lerobot:DIR`` serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

STATE_DIM = 6
ACTION_DIM = 6
IMAGE_SHAPE_CHW = (3, 32, 32)
CAMERAS = ("top", "wrist")
TASK_WORDS = [
    "put",
    "the",
    "cube",
    "in",
    "bowl",
    "pick",
    "up",
    "red",
    "blue",
    "block",
    "place",
    "on",
    "plate",
    "open",
    "drawer",
    "close",
]


def _features(cameras: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))}
    for cam in cameras:
        inputs[f"observation.images.{cam}"] = PolicyFeature(type=FeatureType.VISUAL, shape=IMAGE_SHAPE_CHW)
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))}
    return inputs, outputs


def _stats(cameras: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Non-trivial normalisation stats (so a wrong pre/post-processor shows in the numbers)."""
    import torch

    def vector(dim: int, lo: float, hi: float) -> dict[str, Any]:
        mean = torch.linspace(lo, hi, dim)
        std = torch.linspace(0.5, 1.5, dim)
        return {"mean": mean, "std": std, "min": mean - 2 * std, "max": mean + 2 * std}

    stats = {"observation.state": vector(STATE_DIM, -0.3, 0.4), "action": vector(ACTION_DIM, -0.2, 0.6)}
    for cam in cameras:
        stats[f"observation.images.{cam}"] = {
            "mean": torch.full((3, 1, 1), 0.45), "std": torch.full((3, 1, 1), 0.25),
            "min": torch.zeros(3, 1, 1), "max": torch.ones(3, 1, 1),
        }  # fmt: skip
    return stats


def _save(policy: Any, config: Any, out: Path, cameras: tuple[str, ...]) -> Path:
    from lerobot.policies.factory import make_pre_post_processors

    out.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(out)
    pre, post = make_pre_post_processors(config, dataset_stats=_stats(cameras))
    pre.save_pretrained(out)
    post.save_pretrained(out)
    return out


def make_act(out: str | Path, *, seed: int = 0, cameras: tuple[str, ...] = CAMERAS) -> Path:
    """A random-init ACT (chunk 10, ResNet-18 backbone without pretrained weights)."""
    import torch
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy

    inputs, outputs = _features(cameras)
    config = ACTConfig(
        input_features=inputs, output_features=outputs, chunk_size=10, n_action_steps=10,
        pretrained_backbone_weights=None, dim_model=32, n_heads=2, dim_feedforward=64,
        n_encoder_layers=1, n_decoder_layers=1, latent_dim=8, device="cpu",
    )  # fmt: skip
    torch.manual_seed(seed)
    return _save(ACTPolicy(config), config, Path(out), cameras)


def make_diffusion(out: str | Path, *, seed: int = 0, cameras: tuple[str, ...] = CAMERAS) -> Path:
    """A random-init Diffusion Policy (2 observation steps, horizon 16, 8 actions per chunk).

    DDIM sampling: deterministic given the initial noise (DDPM draws fresh noise at every step
    from torch's global generator, so a seed would fix only its start).
    """
    import torch
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

    inputs, outputs = _features(cameras)
    config = DiffusionConfig(
        input_features=inputs, output_features=outputs, n_obs_steps=2, horizon=16, n_action_steps=8,
        pretrained_backbone_weights=None, crop_shape=None, down_dims=(16, 32), kernel_size=3, n_groups=4,
        diffusion_step_embed_dim=16, spatial_softmax_num_keypoints=4, num_inference_steps=3,
        use_group_norm=True, noise_scheduler_type="DDIM", device="cpu",
    )  # fmt: skip
    torch.manual_seed(seed)
    return _save(DiffusionPolicy(config), config, Path(out), cameras)


def make_tiny_vlm(out: str | Path) -> Path:
    """A tiny random SmolVLM: config, word-level tokenizer and processor (no weights are needed:
    SmolVLA builds the VLM from the config and its own checkpoint holds every weight)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        SmolVLMConfig,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<pad>", "<unk>", "<|im_start|>", "<end_of_utterance>", "<image>",
                "<fake_token_around_image>", "<global-img>", "<row_1_col_1>"]  # fmt: skip
    vocab = {token: i for i, token in enumerate([*specials, *TASK_WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        extra_special_tokens={
            "image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>",
        },
    )  # fmt: skip
    config = SmolVLMConfig(
        text_config={
            "model_type": "llama", "vocab_size": len(vocab), "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "max_position_embeddings": 512, "pad_token_id": 0,
        },
        vision_config={
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "image_size": 32, "patch_size": 8,
        },
        scale_factor=2, image_token_id=vocab["<image>"], vocab_size=len(vocab),
    )  # fmt: skip
    config.save_pretrained(out)
    image_processor = SmolVLMImageProcessor(
        do_resize=False, do_image_splitting=False, max_image_size={"longest_edge": 32}
    )
    processor = SmolVLMProcessor(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=SmolVLMVideoProcessor(),
        image_seq_len=4,
    )  # fmt: skip
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def make_smolvla(
    out: str | Path, *, seed: int = 0, cameras: tuple[str, ...] = CAMERAS, vlm_dir: str | Path | None = None
) -> Path:
    """A random-init SmolVLA (chunk 10, 4 flow steps) over :func:`make_tiny_vlm`'s SmolVLM."""
    import torch
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    out = Path(out)
    vlm = Path(vlm_dir) if vlm_dir is not None else make_tiny_vlm(out.parent / f"{out.name}-vlm")
    inputs, outputs = _features(cameras)
    config = SmolVLAConfig(
        input_features=inputs, output_features=outputs, chunk_size=10, n_action_steps=10,
        max_state_dim=8, max_action_dim=8, resize_imgs_with_padding=(32, 32), tokenizer_max_length=12,
        num_steps=4, vlm_model_name=str(vlm.resolve()), load_vlm_weights=False, num_vlm_layers=2,
        device="cpu",
    )  # fmt: skip
    torch.manual_seed(seed)
    return _save(SmolVLAPolicy(config), config, out, cameras)


BUILDERS = {"act": make_act, "diffusion": make_diffusion, "smolvla": make_smolvla}
