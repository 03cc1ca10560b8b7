"""Image classification with a Vision Transformer: `ClassificationObjective`'s head and cross entropy,
reading `encoder_input_images`. The head sees the [CLS] state (image_pooling="cls", as
ViTForImageClassification) or the mean of the patches' ("mean"). Use with a `vit_*` preset, the
`image_classification` converter (`train.pack = False`) and an image task (`digits`, `mnist`,
`cifar10`); configs/local/vit_tiny_digits.gin is one.
"""
from __future__ import annotations

from typing import Any, Mapping

import gin

from t5lite.errors import ConfigError
from t5lite.infer import classify
from t5lite.models import flops, vision
from t5lite.models.config import ModelConfig
from t5lite.objectives.finetune import ClassificationObjective


@gin.configurable
class ImageClassificationObjective(ClassificationObjective):
    model_inputs = (vision.IMAGES,)

    def __init__(self, num_labels: int = 10):
        super().__init__(num_labels, pooling="first")
        self.image_config: ModelConfig | None = None

    def __repr__(self):
        return f"ImageClassificationObjective(num_labels={self.num_labels})"

    def embedding_rows(self, config) -> None:
        return None   # no token ids: the task's vocabulary is not read

    def build_model(self, config: ModelConfig):
        if not config.image_size:
            raise ConfigError("ImageClassificationObjective trains an image model, and this config has image_size=0: "
                              "use a vit_* preset (model_config.preset = 'vit_tiny')")
        self.pooling = "first" if config.image_pooling == "cls" else "mean"
        self.image_config = config   # init_features makes images of its size
        return super().build_model(config)

    def init_features(self, feature_lengths: Mapping[str, int]) -> dict[str, Any]:
        return {vision.IMAGES: vision.example_images(self.image_config)}

    def train_flops_per_example(self, config: ModelConfig, feature_lengths: Mapping[str, int]) -> float:
        """The encoder over the image's positions, forward and backward (the patch projection not counted)."""
        return 3 * flops.encode_flops(config, config.image_positions)

    def evaluators(self, task, split, task_feature_lengths, **kwargs):
        return {task.name: classify.ImageClassificationEvaluator(task, split, task_feature_lengths, **kwargs)}
