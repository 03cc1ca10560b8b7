"""Several languages at once: English plus Fake-English (t5lite.data.fake_english), BERT's masked
LM on both, for the embedded corpus (no download) and WikiText-2 (`<data_dir>/text/wikitext-2/`).
Feature converter "encoder_positions" (the Fake twin may read positions of its own), no packing.
"""
from __future__ import annotations

from t5lite.data import fake_english
from t5lite.data.corruption import masking, sentence_pairs
from t5lite.data.registry import TaskRegistry
from t5lite.data.tasks.family_pretraining import FULL_SENTENCES, SOURCE
from t5lite.data.tasks.pretraining import FEATURES

FAKE_ENGLISH_MLM = [sentence_pairs.tokenize_sentences, FULL_SENTENCES, fake_english.twins, masking.bert_mlm,
                    fake_english.fake_english]

for _name, _source in (("embedded_docs", SOURCE), ("wikitext2", TaskRegistry.get("wikitext2").source)):
    TaskRegistry.add(f"{_name}_fake_english_mlm", source=_source, preprocessors=FAKE_ENGLISH_MLM,
                     output_features=FEATURES)
