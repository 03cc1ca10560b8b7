"""Sentence-embedding tasks (bi-encoders, Sentence-BERT): pairs of texts, each encoded on its own
(t5lite.data.sentence_texts), for training with a sentence loss and for evaluation.

- `sentence_stsb`: STS-B sentence pairs, `label` the score / 5 (in [0, 1], the cosine-regression
  target; CoSENT only uses its order); evaluated by the Pearson / Spearman correlation x100 of
  the cosine similarities with the gold scores.
- `sentence_mrpc`: MRPC sentence pairs, `label` 1 for a paraphrase, 0 not (the contrastive and
  softmax losses' labels); evaluated as STS-B is, the correlations of cosines with the labels.
- `sentence_squad_v1`: SQuAD v1.1 question -> its paragraph; evaluated as retrieval of each
  question's paragraph among all distinct paragraphs of the split (recall@1/5/10, MRR@10,
  nDCG@10, x100). Reads `train-v1.1.json` / `dev-v1.1.json` under data_dir.
- `sentence_multi30k_en_de`: a Multi30k English caption -> its German translation, retrieved
  among all German captions of the split (a multilingual or jointly trained encoder). Reads the
  aligned `task1/raw/{train,val,test_2016_flickr}.{en,de}` under data_dir.

Train with the `sentence_texts` converter and `SentenceObjective`
(gin/objectives/sentence.gin); TASK_FEATURE_LENGTHS names a length per text, `text0`, `text1`.
"""
from __future__ import annotations

import functools
from typing import Iterable, Iterator

from t5lite import metrics
from t5lite.data.registry import Example, TaskRegistry
from t5lite.data.sentence_texts import sentence_texts
from t5lite.data.sources import FileSource, ParallelText
from t5lite.data.tasks import glue, squad  # noqa: F401  (registers the tasks whose sources are reused)
from t5lite.data.tasks.pretraining import FEATURES

STSB_MAX_SCORE = 5.0
SIMILARITY_METRICS = (metrics.pearson_corrcoef, metrics.spearman_corrcoef)


def scaled_score(dataset: Iterable[Example], maximum: float = STSB_MAX_SCORE) -> Iterator[Example]:
    """`label` / maximum: STS-B's 0..5 score as a similarity in [0, 1]."""
    for ex in dataset:
        yield {**ex, "label": float(ex["label"]) / maximum}


TaskRegistry.add("sentence_stsb", source=TaskRegistry.get("glue_stsb").source,
                 preprocessors=[scaled_score, functools.partial(sentence_texts, text_keys=("sentence1", "sentence2"))],
                 output_features=FEATURES, metric_fns=SIMILARITY_METRICS)

TaskRegistry.add("sentence_mrpc", source=TaskRegistry.get("glue_mrpc").source,
                 preprocessors=[functools.partial(sentence_texts, text_keys=("sentence1", "sentence2"))],
                 output_features=FEATURES, metric_fns=SIMILARITY_METRICS)

TaskRegistry.add("sentence_squad_v1", source=TaskRegistry.get("squad_v1").source,
                 preprocessors=[functools.partial(sentence_texts, text_keys=("question", "context"))],
                 output_features=FEATURES, metric_fns=[metrics.retrieval])

TaskRegistry.add("sentence_multi30k_en_de",
                 source=FileSource({"train": "task1/raw/train", "validation": "task1/raw/val",
                                    "test": "task1/raw/test_2016_flickr"}, ParallelText(("en", "de"))),
                 preprocessors=[functools.partial(sentence_texts, text_keys=("en", "de"))],
                 output_features=FEATURES, metric_fns=[metrics.retrieval])
