"""Multi30k's English and German captions as plain text, one caption per example (`targets`,
`targets_pretokenized`): `multi30k_en_lines` and `multi30k_de_lines`, for word vectors of each
language (the `word2vec` converter). The files go in `<data_dir>/multi30k/task1/raw/` as
`train.{en,de}`, `val.{en,de}` and `test_2016_flickr.{en,de}`.
"""
from __future__ import annotations

from t5lite.data import preprocessors as P
from t5lite.data.registry import TaskRegistry
from t5lite.data.sources import FileSource, TextLines
from t5lite.data.tasks.pretraining import FEATURES
from t5lite.data.tasks.text import AS_TARGETS

_RAW = "multi30k/task1/raw/"

for _language in ("en", "de"):
    TaskRegistry.add(
        f"multi30k_{_language}_lines",
        source=FileSource({"train": f"{_RAW}train.{_language}", "validation": f"{_RAW}val.{_language}",
                           "test": f"{_RAW}test_2016_flickr.{_language}"}, TextLines()),
        preprocessors=[AS_TARGETS, P.tokenize],
        output_features={"targets": FEATURES["targets"]},
    )
