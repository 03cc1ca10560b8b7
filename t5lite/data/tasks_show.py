"""Printing a few preprocessed examples of a task, as text and as token ids."""
from __future__ import annotations

import itertools

import numpy as np


# How many ids an example shows at each end unless all are asked for: the text above them stays on screen.
HEAD_IDS, TAIL_IDS = 10, 5


def show_examples(task, split: str, num_examples: int = 3, data_dir=None, sequence_length=None, out=print,
                  all_ids: bool = False) -> None:
    dataset = task.get_dataset(split, sequence_length=sequence_length, data_dir=data_dir)
    for i, ex in enumerate(itertools.islice(dataset, num_examples)):
        out(f"--- example {i}")
        for key, feature in task.output_features.items():
            if key not in ex:
                continue
            ids = np.asarray(ex[key])
            if ids.dtype.kind == "f":   # an image task's image: its shape, range and label, not text
                out(f"{key}: image {list(ids.shape)} {ids.dtype}, values {ids.min():.3g} to {ids.max():.3g}; "
                    f"label {ex.get('label')}")
                continue
            text = ex.get(f"{key}_pretokenized")
            if text is not None:
                out(f"{key}_pretokenized: {text}")
            out(f"{key} (decoded): {feature.vocabulary.decode(ids.tolist())}")
            out(f"{key} ids ({len(ids)}): {format_ids(ids.tolist(), all_ids)}")


def format_ids(ids: list[int], all_ids: bool = False) -> str:
    """The ids, or only the first and last few with how many are left out (a 512-id example would bury
    its readable text); `all_ids` prints every one."""
    if all_ids or len(ids) <= HEAD_IDS + TAIL_IDS:
        return str(ids)
    left_out = len(ids) - HEAD_IDS - TAIL_IDS
    head, tail = ", ".join(map(str, ids[:HEAD_IDS])), ", ".join(map(str, ids[-TAIL_IDS:]))
    return f"[{head}, ... {left_out} more ..., {tail}] (--all_ids prints every id)"
