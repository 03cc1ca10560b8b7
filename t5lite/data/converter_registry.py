"""Feature converters by name, the names `train.feature_converter` and the task tables use.

It sits above both converter modules (the language-model and pre-training converters, and the
fine-tuning ones), so neither needs to import the other to be listed.
"""
from __future__ import annotations

import functools
from typing import Callable

from t5lite.data.converters import (DecoderOnlyLMFeatureConverter, EncDecFeatureConverter, EncoderFeatureConverter,
                                    FeatureConverter, PrefixLMFeatureConverter)
from t5lite.data.finetune_converters import (EncoderClassificationConverter, EncoderSpanConverter,
                                             EncoderTaggingConverter)
from t5lite.data.consecutive_sentences import ConsecutiveSentencesConverter
from t5lite.data.word_converters import WordClassificationConverter, WordLMConverter, WordLMStreamConverter
from t5lite.data.sentence_texts import SentenceTextsConverter
from t5lite.data.word2vec_converter import Word2VecConverter
from t5lite.data.gpt_inputs import DecoderClassificationConverter
from t5lite.data.control_codes import ControlLMFeatureConverter
from t5lite.data.image_converters import ImageClassificationConverter, ImageToTextConverter
from t5lite.errors import UnknownNameError

FEATURE_CONVERTERS: dict[str, Callable[..., FeatureConverter]] = {
    **{cls.name: cls for cls in (EncDecFeatureConverter, DecoderOnlyLMFeatureConverter, PrefixLMFeatureConverter,
                                 EncoderFeatureConverter, EncoderClassificationConverter, EncoderSpanConverter,
                                 EncoderTaggingConverter, SentenceTextsConverter, Word2VecConverter,
                                 DecoderClassificationConverter, ConsecutiveSentencesConverter,
                                 ImageClassificationConverter, ImageToTextConverter, ControlLMFeatureConverter)},
    # The encoder pre-training objectives' inputs.
    "encoder_nsp": functools.partial(EncoderFeatureConverter, sentence_label="next_sentence_label"),
    "encoder_sop": functools.partial(EncoderFeatureConverter, sentence_label="sentence_order_label"),
    "encoder_sbo": functools.partial(EncoderFeatureConverter, span_boundaries=True),
    "encoder_positions": functools.partial(EncoderFeatureConverter, positions=True),
    # Word-level recurrent models (t5lite.data.word_converters): ULMFiT's AWD-LSTM, ELMo (with chars).
    "word_lm": WordLMConverter,
    "word_lm_stream": WordLMStreamConverter,
    "word_lm_chars": functools.partial(WordLMConverter, chars=True),
    "word_classification": WordClassificationConverter,
    "word_classification_chars": functools.partial(WordClassificationConverter, chars=True),
    # GPT-1's similarity tasks: each pair in both orders.
    "decoder_classification_both_orders": functools.partial(DecoderClassificationConverter, both_orders=True),
}


def get_feature_converter(name: str, **kwargs) -> FeatureConverter:
    """A converter by its short name: "enc_dec", "decoder", "prefix_lm", "encoder" (MLM),
    "encoder_nsp" / "encoder_sop" / "encoder_sbo" (MLM plus BERT's, ALBERT's or SpanBERT's extra
    features), "encoder_positions" (MLM at the example's own positions: XLM's TLM, Fake-English),
    "encoder_classification" / "encoder_span" / "encoder_tagging" (fine-tuning with a task head),
    "decoder_classification" / "decoder_classification_both_orders" (a decoder-only model's last-token
    classifier), "control_lm" (a control code and its text as one causal sequence, loss on the
    text: CTRL), "word_lm" / "word_classification" (word ids; `_chars` adds ELMo's char ids); "word_lm_stream"
    (ULMFiT's LM: fastai's contiguous-row stream); "sentence_texts"
    (bi-encoders: each text on its own); "consecutive_sentences" (a text's sentences in order,
    for Quick-Thought); "word2vec" (word ids of text lines for t5lite.objectives.word2vec);
    "image_classification" (a ViT's images and class ids); "image_to_text" (an image encoder-decoder's
    images and its decoder's text)."""
    if name not in FEATURE_CONVERTERS:
        raise UnknownNameError(f"unknown feature converter {name!r}; choose one of {sorted(FEATURE_CONVERTERS)}")
    return FEATURE_CONVERTERS[name](**kwargs)
