"""Several languages at once.

Fake-English (t5lite.data.fake_english): BERT's masked LM on English plus its Fake twin, for the
embedded corpus (no download) and WikiText-2 (`<data_dir>/text/wikitext-2/`).
XLM's translation LM (t5lite.data.corruption.translation_lm) on parallel sentences, English first:
Multi30k's captions (`<data_dir>/multi30k/task1/raw/{train,val,test_2016_flickr}.{en,de}`) and WMT's
pairs (the `wmt14_ende` / `wmt16_enro` sources: TFDS, or the aligned files their task reads).
All use the feature converter "encoder_positions", without packing.
"""
from __future__ import annotations

import functools

from t5lite.data import fake_english
from t5lite.data.corruption import masking, sentence_pairs, translation_lm
from t5lite.data.registry import TaskRegistry
from t5lite.data.sources import FileSource, ParallelText
from t5lite.data.tasks.family_pretraining import FULL_SENTENCES, SOURCE
from t5lite.data.tasks.pretraining import FEATURES

FAKE_ENGLISH_MLM = [sentence_pairs.tokenize_sentences, FULL_SENTENCES, fake_english.twins, masking.bert_mlm,
                    fake_english.fake_english]

for _name, _source in (("embedded_docs", SOURCE), ("wikitext2", TaskRegistry.get("wikitext2").source)):
    TaskRegistry.add(f"{_name}_fake_english_mlm", source=_source, preprocessors=FAKE_ENGLISH_MLM,
                     output_features=FEATURES)

_MULTI30K = "multi30k/task1/raw/"
_PARALLEL = {
    "multi30k_en_de": FileSource({"train": _MULTI30K + "train", "validation": _MULTI30K + "val",
                                  "test": _MULTI30K + "test_2016_flickr"}, ParallelText(("en", "de"))),
    "wmt14_en_de": TaskRegistry.get("wmt14_ende").source,
    "wmt16_en_ro": TaskRegistry.get("wmt16_enro").source,
}
for _name, _source in _PARALLEL.items():
    _languages = tuple(_name.split("_")[-2:])
    TaskRegistry.add(f"{_name}_tlm", source=_source,
                     preprocessors=[functools.partial(translation_lm.tlm_pairs, languages=_languages),
                                    translation_lm.translation_lm_mask],
                     output_features=FEATURES)
