"""Printing a few preprocessed examples of a task, as text and as token ids."""
from __future__ import annotations

import itertools

import numpy as np


def show_examples(task, split: str, num_examples: int = 3, data_dir=None, sequence_length=None, out=print) -> None:
    dataset = task.get_dataset(split, sequence_length=sequence_length, data_dir=data_dir)
    for i, ex in enumerate(itertools.islice(dataset, num_examples)):
        out(f"--- example {i}")
        for key, feature in task.output_features.items():
            if key not in ex:
                continue
            ids = np.asarray(ex[key])
            text = ex.get(f"{key}_pretokenized")
            if text is not None:
                out(f"{key}_pretokenized: {text}")
            out(f"{key} (decoded): {feature.vocabulary.decode(ids.tolist())}")
            out(f"{key} ids ({len(ids)}): {ids.tolist()}")
