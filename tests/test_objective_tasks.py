"""The objective tasks over the embedded corpus run through the Loader with the existing converters."""
import itertools

import gin
import numpy as np
import pytest

import t5lite.data.tasks  # noqa: F401  (registers the tasks)
from t5lite.data import get_task
from t5lite.data.loader import Loader
from t5lite.data.corruption import denoise
from t5lite.data.corruption.masking import special_ids

LENGTHS = {"inputs": 32, "targets": 32}


def batches(name, converter, count=3, state=None, **kwargs):
    loader = Loader(get_task(f"embedded_docs_{name}"), "train", LENGTHS, 4, converter, seed=3,
                    shard_index=0, shard_count=1, **kwargs)
    if state:
        loader.restore(state)
    return list(itertools.islice(loader, count)), loader.state()


def test_causal_lm_batches_are_the_packed_document_stream_and_resume_exactly():
    got, state = batches("causal_lm", "decoder", pack=False, shuffle=False)  # 12 rows, all from the first block
    task = get_task("embedded_docs_causal_lm")
    pieces = [ex["targets"] for ex in itertools.islice(task.get_dataset("train", LENGTHS, shuffle=False), 12)]
    rows = np.concatenate([b["decoder_target_tokens"] for b in got])
    for row, piece in zip(rows, pieces):
        assert row.tolist() == piece.tolist()   # full pieces of 32: the stream, EOS at document ends only
    assert (got[0]["decoder_input_tokens"][:, 1:] == got[0]["decoder_target_tokens"][:, :-1]).all()
    assert (got[0]["decoder_loss_weights"] == 1).all()
    first, mid = batches("causal_lm", "decoder", count=1, pack=False, shuffle=False)
    rest, _ = batches("causal_lm", "decoder", count=2, state=mid, pack=False, shuffle=False)
    assert all(np.array_equal(a["decoder_target_tokens"], b["decoder_target_tokens"]) for a, b in zip(got[1:], rest))


@pytest.mark.parametrize("layout", ["fairseq", "uniform"])
def test_bart_batches_have_noised_inputs_and_the_original_as_targets(layout, clean_gin_state):
    gin.bind_parameter("bart_denoise.layout", layout)   # as `bart_denoise.layout = 'uniform'` in a gin file
    got, _ = batches("bart_denoise", "enc_dec", pack=False)
    vocabulary = get_task("embedded_docs_bart_denoise").output_features["targets"].vocabulary
    mask = special_ids(vocabulary)["mask"]
    lengths = []
    for b in got:
        for inputs, targets in zip(b["encoder_input_tokens"], b["decoder_target_tokens"]):
            n = int((targets != 0).sum()) - 1   # without EOS
            assert targets[n] == 1
            assert (inputs == mask).any()
            lengths.append((int((inputs != 0).sum()) - 1, n))
            if layout == "uniform":   # round(0.3 n) tokens in non-overlapping spans, one [MASK] each
                assert int(((inputs != mask) & (inputs > 1)).sum()) == n - round(0.3 * n)
    if layout == "fairseq":   # ~30% of the words in spans of mean 3.5 words become one token each
        kept = sum(i for i, _ in lengths) / sum(n for _, n in lengths)
        assert 0.65 < kept < 0.92


def test_bert_mlm_batches_weight_exactly_the_chosen_positions():
    got, _ = batches("bert_mlm", "encoder", pack=True)
    for b in got:
        changed = b["encoder_input_tokens"] != b["encoder_target_tokens"]
        weights = b["encoder_loss_weights"].astype(bool)
        assert (weights | ~changed).all() and weights.sum() > 0
        assert b["encoder_segment_ids"].max() >= 1


@pytest.mark.parametrize("name", ["prefix_lm", *(f"t5_{n}" for n in denoise.OBJECTIVES if n != "prefix_lm")])
def test_every_t5_objective_task_fits_its_lengths(name):
    for ex in itertools.islice(get_task(f"embedded_docs_{name}").get_dataset("train", LENGTHS), 5):
        assert len(ex["inputs"]) <= 32 and len(ex["targets"]) <= 32 and ex["inputs"][-1] == ex["targets"][-1] == 1


NEW_GIN = ["bert_mlm", "bert_mlm_static", "doc_sentences_mlm", "bert_nsp", "albert_sop", "spanbert", "causal_lm",
           "prefix_lm", "bart_denoise", "t5_denoise"]


@pytest.mark.parametrize("objective", NEW_GIN)
def test_each_objective_gin_names_a_registered_task_and_converter(objective):
    import re
    from pathlib import Path
    from t5lite.data.converter_registry import FEATURE_CONVERTERS
    text = (Path(__file__).resolve().parent.parent / "gin" / "objectives" / f"{objective}.gin").read_text()
    (task,) = re.findall(r"^MIXTURE_OR_TASK_NAME = '(\w+)'", text, re.M)
    (converter,) = re.findall(r"^train.feature_converter = '(\w+)'", text, re.M)
    assert get_task(task) is not None and converter in FEATURE_CONVERTERS
    next(get_task(task).get_dataset("train", LENGTHS))
