"""Image tasks: `digits` (scikit-learn's bundled 8 x 8 handwritten digits, nothing to download) and,
where the user has prepared them with TFDS, `mnist` (28 x 28 x 1) and `cifar10` (32 x 32 x 3), to
classify; `digits_to_words`, the same digits to write as text ("seven").

Each example's `inputs` is a float32 image [H, W, C] scaled to [0, 1] and `label` its class id;
train them with a ViT preset, `ImageClassificationObjective` and the `image_classification`
converter (configs/local/vit_tiny_digits.gin). `digits` splits the 1797 images with a fixed
permutation (numpy's default_rng(0)): its first 360 images are `validation`, the other 1437 `train`.
`digits_to_words` keeps the image as `inputs` and makes the digit's English word its `targets`
(tokenized, EOS appended): an image-to-text task for an image encoder-decoder (`vit_gpt2_tiny`, the
`image_to_text` converter; configs/local/vit_gpt2_digits_to_words.gin).
"""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from t5lite import metrics
from t5lite.data import preprocessors as P
from t5lite.data.registry import Example, Feature, FunctionSource, TaskRegistry
from t5lite.data.sources import TfdsSource
from t5lite.data.tasks.pretraining import FEATURES
from t5lite.data.vocab import DEFAULT_VOCABULARY
from t5lite.errors import DataNotFoundError

DIGITS_VALIDATION = 360
DIGITS_MAX = 16.0   # the digits' pixels count 0..16 pen strokes
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def digits(split: str) -> list[Example]:
    """The split's digits as {"inputs": [8, 8, 1] in [0, 1], "label", "idx" (the image's index in
    scikit-learn's array)}."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise DataNotFoundError(f"the digits task reads scikit-learn's bundled digits ({e}): pip install "
                                "scikit-learn (t5lite's 'metrics' extra)") from None
    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.images))
    chosen = order[DIGITS_VALIDATION:] if split == "train" else order[:DIGITS_VALIDATION]
    return [{"inputs": (data.images[i] / DIGITS_MAX).astype(np.float32)[..., None], "label": int(data.target[i]),
             "idx": int(i)} for i in chosen]


def digits_with_words(split: str) -> list[Example]:
    """`digits` with each label's word as `targets`, and `inputs_pretokenized` naming the image (an
    image has no text; predictions.jsonl shows this name)."""
    return [{**ex, "targets": WORDS[ex["label"]], "inputs_pretokenized": f"digit image {ex['idx']}"}
            for ex in digits(split)]


def scaled_pixels(dataset: Iterable[Example]) -> Iterator[Example]:
    """TFDS's uint8 `image` [H, W, C] -> `inputs` in [0, 1] (float32), with its `label`."""
    for ex in dataset:
        yield {"inputs": np.asarray(ex["image"], np.float32) / 255.0, "label": int(ex["label"])}


TaskRegistry.add("digits", source=FunctionSource(digits), preprocessors=[], output_features=FEATURES,
                 metric_fns=[metrics.accuracy])
# Only `targets` is text: the image passes the preprocessors untouched.
TaskRegistry.add("digits_to_words", source=FunctionSource(digits_with_words),
                 preprocessors=[P.tokenize, P.append_eos_after_trim],
                 output_features={"targets": Feature(DEFAULT_VOCABULARY)}, metric_fns=[metrics.accuracy])
for _name in ("mnist", "cifar10"):
    TaskRegistry.add(_name, source=TfdsSource(_name, splits=("train", "test")), preprocessors=[scaled_pixels],
                     output_features=FEATURES, metric_fns=[metrics.accuracy])
