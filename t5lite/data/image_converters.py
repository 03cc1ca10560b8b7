"""Images for a Vision Transformer with a task head: the `image_classification` converter.

An image task's examples hold `inputs`, a float32 image [H, W, C], and `label`, its class id; the
converter names them `encoder_input_images` and `label` ([1], as the text classifiers' label). One
image per row: a ViT's rows are all the same length, so there is nothing to pack.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from t5lite.data.converters import EXAMPLES_KEY, FeatureConverter, Row, _length
from t5lite.data.registry import Example
from t5lite.errors import ConfigError, DataError
from t5lite.models.vision import IMAGES


class ImageClassificationConverter(FeatureConverter):
    """`inputs` [side, side, C] -> `encoder_input_images` (float32), `label` -> [1] int32.
    TASK_FEATURE_LENGTHS['inputs'] is the images' side in pixels; an image of another size is refused."""
    name = "image_classification"

    def model_feature_lengths(self, task_feature_lengths, pack=False):
        _check_unpacked(pack)
        return {IMAGES: _length(task_feature_lengths, "inputs", self.name), "label": 1}

    def convert(self, examples: Iterable[Example], task_feature_lengths, pack=False, restart_every=None
                ) -> Iterator[Row]:
        _check_unpacked(pack)
        side = _length(task_feature_lengths, "inputs", self.name)
        for ex in examples:
            image = np.asarray(ex["inputs"], np.float32)
            if image.ndim != 3 or image.shape[:2] != (side, side):
                raise DataError(f"an image of shape {image.shape} (example {ex.get('idx', '?')}), but "
                                f"TASK_FEATURE_LENGTHS['inputs']={side} reads [{side}, {side}, channels] images; "
                                "set it to the task's image side")
            yield {IMAGES: image, "label": np.asarray([ex["label"]], np.int32), EXAMPLES_KEY: 1}


def _check_unpacked(pack: bool) -> None:
    if pack:
        raise ConfigError("the image_classification converter gives one image per row: set train.pack = False")
