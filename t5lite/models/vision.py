"""The Vision Transformer's front end (Dosovitskiy et al. 2021, "An image is worth 16x16 words"): an
image cut into P x P patches, each flattened and projected to d_model (the arithmetic of a
stride-P convolution), after a learned [CLS] vector. The encoder `Stack` adds its learned 1-D
positions and runs its layers on these vectors as on token embeddings; nothing else changes.

The patch kernel is laid out [P, P, channels, d_model] (flax's convolution layout), its input the
patches in row-major order, each [P, P, channels] as the image stores it.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from t5lite.errors import ConfigError
from t5lite.models import layers as L
from t5lite.models.config import ModelConfig

IMAGES = "encoder_input_images"


def patches(images, patch_size: int):
    """[batch, H, W, C] -> [batch, (H / P) * (W / P), P, P, C]: the patches row by row, left to right
    (the order of a convolution's flattened output)."""
    b, h, w, c = images.shape
    p = patch_size
    x = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // p) * (w // p), p, p, c)


def position_tokens(config: ModelConfig, images):
    """Stand-in token ids [batch, positions] for the encoder's masks: a non-padding id at every
    position of an image (its [CLS] and patches), so every position attends to every other."""
    return jnp.full((images.shape[0], config.image_positions), config.pad_token_id + 1, jnp.int32)


def encoder_inputs(config: ModelConfig, tokens, images):
    """(tokens, images) as the encoder stack takes them: a text model's tokens and no images; an
    image model's `position_tokens` and its images. A model refuses the other kind of input."""
    if not config.image_size:
        if images is not None:
            raise ConfigError(f"this is a text model (image_size=0), fed {IMAGES}: an image task needs an image "
                              "model, e.g. model_config.preset = 'vit_tiny' (classifier) or 'vit_gpt2_tiny' "
                              "(encoder-decoder)")
        return tokens, None
    if images is None:
        raise ConfigError(f"this is an image model (image_size={config.image_size}): feed it {IMAGES} "
                          "[batch, H, W, C], not token ids; an image task and the 'image_classification' "
                          "or 'image_to_text' converter give them")
    return position_tokens(config, images), images


def example_images(config: ModelConfig, batch: int = 1):
    """Zero images [batch, H, W, C] of the config's size, to initialise a model with."""
    return jnp.zeros((batch, config.image_size, config.image_size, config.num_channels), jnp.float32)


def init_features(config) -> dict:
    """What an image model's `init` needs beside token ids: {IMAGES: zero images}; {} for any other model."""
    return {IMAGES: example_images(config)} if getattr(config, "image_size", 0) else {}


def check_images(config: ModelConfig, images) -> None:
    """Refuses images the model was not built for, naming the shape it needs."""
    want = (config.image_size, config.image_size, config.num_channels)
    if images.ndim != 4 or tuple(images.shape[1:]) != want:
        raise ConfigError(f"{IMAGES} has shape {tuple(images.shape)}, but the model reads [batch, {want[0]}, "
                          f"{want[1]}, {want[2]}] images (model config image_size, num_channels); resize the "
                          "images or use a config of their size")


class PatchEmbedding(nn.Module):
    """Images [batch, H, W, C] -> vectors [batch, positions, d_model]: the [CLS] vector (image_pooling
    "cls") then each patch's linear projection."""
    config: ModelConfig

    @nn.compact
    def __call__(self, images):
        cfg = self.config
        check_images(cfg, images)
        p = cfg.patch_size
        fan_in_std = (p * p * cfg.num_channels) ** -0.5
        x = L.Dense((cfg.d_model,), ("patch_rows", "patch_cols", "channels", "embed"), 3, True,
                    L.init_std(cfg, fan_in_std), L.dtype_of(cfg), name="projection")(patches(images, p))
        if cfg.image_pooling != "cls":
            return x
        cls = L.param_with_axes(self, "cls", L.normal(L.init_std(cfg, 1.0)), (cfg.d_model,), ("embed",))
        return jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (x.shape[0], 1, cfg.d_model)), x], axis=1)
