"""Pre-training tasks for every family's objective, over the embedded corpus (no download needed), or
over a corpus `t5lite prepare` wrote when the task's data_dir holds one.

Encoders (feature converter "encoder"): BERT's masked LM on RoBERTa's FULL-SENTENCES, dynamic or
static; DOC-SENTENCES; NSP and SOP pairs with MLM; SpanBERT. Decoders ("decoder"): causal LM.
Encoder-decoders ("enc_dec"; prefix LM also "prefix_lm"): BART denoising, T5's prefix LM and every
objective of T5's table (`embedded_docs_t5_<name>`, names in `t5lite.data.corruption.denoise.OBJECTIVES`).
"""
from __future__ import annotations

import functools

from t5lite.data import preprocessors as P
from t5lite.data.corruption import bart_noise, denoise, masking, sentence_pairs
from t5lite.data.registry import Feature, TaskRegistry
from t5lite.data.tasks.pretraining import EMBEDDED_SOURCE, FEATURES
from t5lite.data.vocab import DEFAULT_VOCABULARY

AS_TARGETS = functools.partial(P.rekey, key_map={"inputs": None, "targets": "text"})


def _add(name: str, preprocessors, output_features=FEATURES) -> None:
    TaskRegistry.add(f"embedded_docs_{name}", source=EMBEDDED_SOURCE, preprocessors=preprocessors,
                     output_features=output_features)


# --- encoders: sentences in, [CLS] ... [SEP] sequences with MLM out.
FULL_SENTENCES = functools.partial(sentence_pairs.full_sentences, cross_documents=True)
DOC_SENTENCES = functools.partial(sentence_pairs.full_sentences, cross_documents=False)
_ENCODER = {
    "bert_mlm": [FULL_SENTENCES, masking.bert_mlm],
    "bert_mlm_static": [FULL_SENTENCES, functools.partial(masking.bert_mlm, static_seed=0, num_static_copies=10)],
    "doc_sentences_mlm": [DOC_SENTENCES, masking.bert_mlm],
    "bert_nsp_mlm": [functools.partial(sentence_pairs.sentence_pairs, objective="nsp"), masking.bert_mlm],
    "albert_sop_mlm": [functools.partial(sentence_pairs.sentence_pairs, objective="sop"), masking.bert_mlm],
    "spanbert": [DOC_SENTENCES, masking.spanbert_mlm],
    # ELECTRA's generator input (its pretrain_helpers.mask): 15% of all tokens, drawn with replacement, 85% [MASK].
    "electra_mlm": [FULL_SENTENCES, masking.electra_mlm],
}
for _name, _steps in _ENCODER.items():
    _add(_name, [sentence_pairs.tokenize_sentences, *_steps])

# --- decoders: t5's full_lm stream.
_add("causal_lm", [functools.partial(P.rekey, key_map={"targets": "text"}), P.tokenize, denoise.causal_lm],
     output_features={"targets": Feature(DEFAULT_VOCABULARY)})

# --- encoder-decoders. BART: pieces of the targets length, noised; targets the original.
_add("bart_denoise", [AS_TARGETS, P.tokenize, P.select_random_chunk, P.reduce_concat_tokens,
                      functools.partial(denoise.split_tokens_to_length, feature="targets"),
                      bart_noise.bart_denoise, P.append_eos_after_trim])

# T5's prefix LM as t5 builds it (no concatenation), then every denoising objective as t5's iid_denoising.
_add("prefix_lm", [AS_TARGETS, P.tokenize, P.select_random_chunk, denoise.split_tokens_to_length,
                   denoise.t5_objective("prefix_lm"), P.append_eos_after_trim])
for _name in denoise.OBJECTIVES:
    if _name != "prefix_lm":
        _add(f"t5_{_name}", [AS_TARGETS, P.tokenize, P.select_random_chunk, P.reduce_concat_tokens,
                             denoise.split_tokens_to_length, denoise.t5_objective(_name), P.append_eos_after_trim])
