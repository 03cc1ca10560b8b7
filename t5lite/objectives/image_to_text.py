"""Image to text with an encoder-decoder whose encoder reads images (`vit_gpt2_tiny`): the default
objective's token cross entropy on the decoder's targets, with the model built, initialised and
counted for images. Use with the `image_to_text` converter (`train.pack = False`) and an image task
whose targets are text (`digits_to_words`); configs/local/vit_gpt2_digits_to_words.gin is one.
Evaluation decodes the text as any encoder-decoder's (t5lite.infer.evaluation)."""
from __future__ import annotations

from typing import Any, Mapping

import gin
import jax.numpy as jnp

from t5lite.errors import ConfigError
from t5lite.models import flops, vision
from t5lite.models.config import ModelConfig
from t5lite.objectives.base import Objective


@gin.configurable
class ImageToTextObjective(Objective):
    def __init__(self):
        self.image_config: ModelConfig | None = None

    def __repr__(self):
        return "ImageToTextObjective()"

    def build_model(self, config: ModelConfig):
        if not config.image_size or config.arch != "encoder_decoder":
            raise ConfigError(f"ImageToTextObjective trains an image encoder-decoder, and this config has arch="
                              f"{config.arch!r}, image_size={config.image_size}: use model_config.preset = "
                              "'vit_gpt2_tiny'")
        self.image_config = config   # init_features makes images of its size
        return super().build_model(config)

    def init_features(self, feature_lengths: Mapping[str, int]) -> dict[str, Any]:
        length = feature_lengths.get("decoder_input_tokens", 1)
        return {vision.IMAGES: vision.example_images(self.image_config),
                "decoder_input_tokens": jnp.ones((1, length), jnp.int32)}

    def train_flops_per_example(self, config: ModelConfig, feature_lengths: Mapping[str, int]) -> float:
        """Forward + backward over the image's positions and the targets (the patch projection not counted)."""
        return flops.train_flops_per_example(config, config.image_positions,
                                             feature_lengths.get("decoder_input_tokens", 0))
