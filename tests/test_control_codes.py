"""Control codes (CTRL): the `sst2_control_lm` examples and the `control_lm` converter against CTRL's
own construction of its training data, and training read the way `t5lite infer` decodes."""
import itertools

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import models
from t5lite.data import get_task
from t5lite.data.control_codes import control_code_text
from t5lite.data.converter_registry import get_feature_converter
from t5lite.infer import scoring
from conftest import assert_close, shared_data_dir

LENGTHS = {"inputs": 4, "targets": 60}


def ctrl_training_pair(domain: list[int], text: list[int], seq_length: int) -> tuple[list[int], list[int]]:
    """The first (input, output) record of salesforce/ctrl training_utils/make_tf_records.py, transcribed
    (its loop body at i = 0, with `seq_length = args.sequence_len - 1`):
        inputs = numericalize(domain + tokenized_train_text[i:i+seq_length])
        outputs = numericalize(tokenized_train_text[i:i+seq_length+1])
    The control code is the first input and never an output."""
    return domain + text[0:seq_length], text[0:seq_length + 1]


@pytest.fixture(scope="module")
def sst2_examples():
    gin.clear_config()
    gin.parse_config("vocabulary.kind = 'byte_bpe'")
    task = get_task("sst2_control_lm")
    examples = list(itertools.islice(task.get_dataset("validation", LENGTHS, data_dir=str(shared_data_dir() / "glue")), 6))
    yield task, examples
    gin.clear_config()


def test_one_token_code_gives_ctrls_records():
    """Unpacked, a one-token code and a text ending in EOS give CTRL's inputs and outputs, every
    output weighted; the rest of the row is padding with no weight."""
    code, text = [7], [40, 41, 42, 43, 1]
    (row,) = get_feature_converter("control_lm").convert([{"inputs": code, "targets": text}], {"inputs": 2, "targets": 8})
    inputs, outputs = ctrl_training_pair(code, text, seq_length=len(text) - 1)
    n = len(inputs)
    np.testing.assert_array_equal(row["decoder_input_tokens"][:n], inputs)
    np.testing.assert_array_equal(row["decoder_target_tokens"][:n], outputs)
    np.testing.assert_array_equal(row["decoder_loss_weights"], [1] * n + [0] * (len(row["decoder_loss_weights"]) - n))


def test_sst2_examples_are_the_code_then_the_sentence_as_infer_encodes_the_prompt(sst2_examples):
    """Each dev sentence follows its label's name, and the tokens are those of the prompt
    "<code> <sentence>" that `t5lite infer` would feed (no start token), EOS last."""
    task, examples = sst2_examples
    vocabulary = task.output_features["targets"].vocabulary
    labels = [0, 1]
    assert {int(ex["label"]) for ex in examples} == set(labels)
    for ex in examples:
        code = ("negative", "positive")[int(ex["label"])]   # SST-2's label names (GLUE: 0 negative, 1 positive)
        assert ex["inputs_pretokenized"] == code
        prompt = code + ex["targets_pretokenized"]
        assert ex["targets_pretokenized"].startswith(" ")
        np.testing.assert_array_equal(np.concatenate([ex["inputs"], ex["targets"]]),
                                      vocabulary.encode(prompt) + [vocabulary.eos_id])


def test_unlabelled_rows_have_no_code():
    """A test split's rows (label -1) have no code and are left out."""
    rows = [{"sentence": "a film .", "label": -1}, {"sentence": " dull . ", "label": 0}]
    assert list(control_code_text(rows, codes=("negative", "positive"))) == [
        {"inputs": "negative", "targets": " dull .", "label": 0}]


def test_packed_rows_weight_only_each_sentence(sst2_examples):
    """Packed: each example's code tokens are inputs only (the last one predicts the sentence's first
    token), no token predicts across examples, and the per-example features equal the unpacked ones."""
    _, examples = sst2_examples
    converter = get_feature_converter("control_lm")
    unpacked = list(converter.convert(examples, LENGTHS))
    packed = list(converter.convert(examples, LENGTHS, pack=True))
    assert sum(row["_examples"] for row in packed) == len(examples) and len(packed) < len(examples)
    pieces = []
    for row in packed:
        for segment in range(1, row["_examples"] + 1):
            at = row["decoder_segment_ids"] == segment
            pieces.append({k: row[k][at] for k in ("decoder_input_tokens", "decoder_target_tokens",
                                                    "decoder_loss_weights")})
            np.testing.assert_array_equal(row["decoder_positions"][at], np.arange(at.sum()))
    for ex, alone, piece in zip(examples, unpacked, pieces):
        n, k = len(ex["inputs"]) + len(ex["targets"]), len(ex["inputs"])
        weights = np.r_[np.zeros(k - 1), np.ones(n - k), 0]   # predicts a sentence token (EOS included)
        np.testing.assert_array_equal(piece["decoder_loss_weights"], weights)
        for key, value in piece.items():
            np.testing.assert_array_equal(alone[key][:n], value)


def test_trained_loss_is_the_log_likelihood_infer_scores_after_the_code(sst2_examples):
    """The weighted token losses of a row are minus the log-probabilities `t5lite infer`'s scoring
    gives the sentence as the continuation of the prompt "<code>" (a random gpt2_tiny): training
    and decoding read the same sequence."""
    _, examples = sst2_examples
    config = models.get_config("gpt2_tiny", vocab_size=2176, dropout_rate=0.0)
    module = models.build(config)
    row = next(get_feature_converter("control_lm").convert(examples[:1], LENGTHS))
    batch = {k: jnp.asarray(v)[None] for k, v in row.items() if k != "_examples"}
    params = module.init(jax.random.key(0), decoder_input_tokens=batch["decoder_input_tokens"])["params"]
    logits = module.apply({"params": params}, decoder_input_tokens=batch["decoder_input_tokens"])
    log_probs = jax.nn.log_softmax(logits)
    picked = jnp.take_along_axis(log_probs, batch["decoder_target_tokens"][..., None], axis=-1)[0, :, 0]
    trained = np.asarray(picked)[np.asarray(row["decoder_loss_weights"]) > 0]
    ex = examples[0]
    scored = scoring.token_log_likelihoods(module, params, {"decoder_prompt_tokens": jnp.asarray(ex["inputs"])[None]},
                                           jnp.asarray(ex["targets"])[None])
    assert_close(trained, np.asarray(scored)[0])


@pytest.mark.parametrize("method, penalty, says", [("beam", 1.2, "not beam search"), ("sample", 0.0, "must be positive"),
                                                   ("greedy", -1.0, "must be positive")])
def test_infer_refuses_a_penalty_it_cannot_apply(method, penalty, says):
    from t5lite.errors import ConfigError
    from t5lite.infer import predict
    with pytest.raises(ConfigError, match=says) as error:
        predict.check_method(method, repetition_penalty=penalty)
    assert "infer.repetition_penalty" in str(error.value) and "\n" not in str(error.value)
    predict.check_method(method, repetition_penalty=1.0)   # off: every method
