"""Several languages at once.

Fake-English (t5lite.data.fake_english): BERT's masked LM on English plus its Fake twin, for the
embedded corpus (no download) and WikiText-2 (`<data_dir>/text/wikitext-2/`).
XLM's translation LM (t5lite.data.corruption.translation_lm) on parallel sentences, English first:
Multi30k's captions (`<data_dir>/multi30k/task1/raw/{train,val,test_2016_flickr}.{en,de}`) and WMT's
pairs (the `wmt14_ende` / `wmt16_enro` sources: TFDS, or the aligned files their task reads).
All use the feature converter "encoder_positions", without packing.
mBERT/XLM's masked LM on several languages at once: `multi30k_{en,de}_mlm` (each language's
captions as RoBERTa's FULL-SENTENCES rows, one language per row, as XLM's text streams) and their
mixture `multi30k_en_de_mlm` (its alpha is XLM's; the two caption sets are the same size, so each
language is drawn half the time), for a vocabulary shared by the languages (`t5lite prepare --vocab_size`).
`bert_glue_sst2_fake_english` is `bert_glue_sst2` read in Fake-English, to evaluate an English
fine-tuned classifier on zero-shot (its examples carry the Fake positions, which the unpacked
`encoder_classification` converter passes on).
"""
from __future__ import annotations

import functools

from t5lite.data import fake_english
from t5lite.data.corruption import masking, sentence_pairs, translation_lm
from t5lite.data.registry import ExamplesProportional, MixtureRegistry, TaskRegistry
from t5lite.data.sources import FileSource, ParallelText
from t5lite.data.tasks import bert_finetune  # noqa: F401  (registers bert_glue_sst2, read here in Fake-English)
from t5lite.data.tasks import multi30k_text  # noqa: F401  (registers multi30k_<lang>_lines, read here for MLM)
from t5lite.data.tasks.family_pretraining import FULL_SENTENCES
from t5lite.data.tasks.pretraining import EMBEDDED_SOURCE, FEATURES

FAKE_ENGLISH_MLM = [sentence_pairs.tokenize_sentences, FULL_SENTENCES, fake_english.twins, masking.bert_mlm,
                    fake_english.fake_english]

for _name, _source in (("embedded_docs", EMBEDDED_SOURCE), ("wikitext2", TaskRegistry.get("wikitext2").source)):
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

for _language in ("en", "de"):
    TaskRegistry.add(f"multi30k_{_language}_mlm", source=TaskRegistry.get(f"multi30k_{_language}_lines").source,
                     preprocessors=[sentence_pairs.tokenize_sentences, FULL_SENTENCES, masking.bert_mlm],
                     output_features=FEATURES)
MixtureRegistry.add("multi30k_en_de_mlm", [(f"multi30k_{language}_mlm", ExamplesProportional())
                                           for language in ("en", "de")], alpha=0.5)

_SST2 = TaskRegistry.get("bert_glue_sst2")
TaskRegistry.add("bert_glue_sst2_fake_english", source=_SST2.source,
                 preprocessors=[*_SST2.preprocessors, fake_english.all_fake, fake_english.fake_english],
                 output_features=_SST2.output_features, metric_fns=_SST2.metric_fns)
