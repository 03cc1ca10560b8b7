"""Images for a Vision Transformer: the `image_classification` and `image_to_text` converters.

An image task's examples hold `inputs`, a float32 image [H, W, C], and `label`, its class id, or
`targets`, its text's token ids. `image_classification` names them `encoder_input_images` and
`label` ([1], as the text classifiers' label); `image_to_text` gives an encoder-decoder the images
and the decoder features of `targets` (padded, as `enc_dec`'s). One image per row: a ViT's rows
are all the same length, so there is nothing to pack.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from t5lite.data.converters import EXAMPLES_KEY, FeatureConverter, Row, _decoder_features, _length, pad
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
            yield {IMAGES: _image(ex, side), "label": np.asarray([ex["label"]], np.int32), EXAMPLES_KEY: 1}


class ImageToTextConverter(FeatureConverter):
    """`inputs` [side, side, C] -> `encoder_input_images`; `targets` -> `decoder_target_tokens`,
    `decoder_input_tokens` (shifted right, 0 first) and `decoder_loss_weights`, padded with 0 to
    TASK_FEATURE_LENGTHS['targets'] (longer targets are cut there)."""
    name = "image_to_text"

    def model_feature_lengths(self, task_feature_lengths, pack=False):
        _check_unpacked(pack, self.name)
        targets = _length(task_feature_lengths, "targets", self.name)
        return {IMAGES: _length(task_feature_lengths, "inputs", self.name), "decoder_target_tokens": targets,
                "decoder_input_tokens": targets, "decoder_loss_weights": targets}

    def convert(self, examples: Iterable[Example], task_feature_lengths, pack=False, restart_every=None
                ) -> Iterator[Row]:
        _check_unpacked(pack, self.name)
        side = _length(task_feature_lengths, "inputs", self.name)
        lengths = {"targets": _length(task_feature_lengths, "targets", self.name)}
        for ex in examples:
            image = _image(ex, side)
            row = next(pad([ex], lengths))
            yield {IMAGES: image, **_decoder_features(row, packed=False), EXAMPLES_KEY: 1}


def _image(example: Example, side: int) -> np.ndarray:
    """The example's `inputs` as a float32 image, refused unless it is [side, side, channels]."""
    image = np.asarray(example["inputs"], np.float32)
    if image.ndim != 3 or image.shape[:2] != (side, side):
        raise DataError(f"an image of shape {image.shape} (example {example.get('idx', '?')}), but "
                        f"TASK_FEATURE_LENGTHS['inputs']={side} reads [{side}, {side}, channels] images; "
                        "set it to the task's image side")
    return image


def _check_unpacked(pack: bool, converter: str = ImageClassificationConverter.name) -> None:
    if pack:
        raise ConfigError(f"the {converter} converter gives one image per row: set train.pack = False")
