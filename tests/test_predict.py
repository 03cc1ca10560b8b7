"""`t5lite infer`'s encoding of free text: an encoder's input keeps its start and ends in EOS, a
prompt to continue keeps its end; the cuts are warned about once, with their count."""
import logging

import numpy as np
import pytest

from t5lite.infer.predict import decoded_lengths, encode_texts, until_eos


class ByteVocab:
    """One id per UTF-8 byte (+3), so a text's length in tokens is its length in bytes."""

    def encode(self, text):
        return [b + 3 for b in text.encode()]


def test_truncated_inputs_are_warned_about_once_with_their_count(caplog):
    texts = ["short", "a much longer input text", "exactly 7", "another long input"]
    with caplog.at_level(logging.WARNING, logger="t5lite.infer.predict"):
        rows, lengths = encode_texts(ByteVocab(), texts, max_length=10, multiple=4)
    assert [r.getMessage() for r in caplog.records] == [
        "2 of 4 inputs are longer than infer.max_input_length=10 tokens (with EOS): truncated to their first 10 "
        "tokens (input 1, 3); raise infer.max_input_length to decode more of them"]
    np.testing.assert_array_equal(rows[1], [b + 3 for b in texts[1].encode()[:9]] + [1])
    np.testing.assert_array_equal(rows[2], [b + 3 for b in texts[2].encode()] + [1])  # 9 + EOS fits exactly
    np.testing.assert_array_equal(rows[0], [b + 3 for b in texts[0].encode()] + [1] + [0] * 4)  # one EOS, then pad
    np.testing.assert_array_equal(lengths, [6, 10, 10, 10])


def test_prompts_keep_their_end_without_eos_padded_with_the_pad_id(caplog):
    texts = ["abc", "a long prompt"]
    with caplog.at_level(logging.WARNING, logger="t5lite.infer.predict"):
        rows, lengths = encode_texts(ByteVocab(), texts, max_length=8, append_eos=False, pad_id=1, multiple=4)
    assert [r.getMessage() for r in caplog.records] == [
        "1 of 2 inputs are longer than infer.max_input_length=8 tokens: truncated to their last 8 tokens (input 1); "
        "raise infer.max_input_length to decode more of them"]
    np.testing.assert_array_equal(rows, [[b + 3 for b in b"abc"] + [1] * 5, [b + 3 for b in b"g prompt"]])
    np.testing.assert_array_equal(lengths, [3, 8])


def test_decoded_rows_end_at_the_models_eos():
    tokens = np.array([[5, 7, 2, 1, 1], [5, 6, 7, 8, 9]])
    np.testing.assert_array_equal(decoded_lengths(tokens, eos_id=2), [3, 5])
    np.testing.assert_array_equal(until_eos(tokens[0], 2), [5, 7])
    np.testing.assert_array_equal(until_eos(tokens[1], 2), tokens[1])


def test_an_unknown_decoding_method_is_a_config_error_before_loading_anything():
    from t5lite.errors import ConfigError
    from t5lite.infer.predict import infer
    with pytest.raises(ConfigError, match="infer.method must be greedy, beam or sample; got 'bam'"):
        infer(["x"], checkpoint_path="/nonexistent", model=None, method="bam")


def test_unknown_beam_rules_are_a_config_error_before_loading_anything():
    from t5lite.errors import ConfigError
    from t5lite.infer.predict import infer
    with pytest.raises(ConfigError, match="infer.beam_rules must be 't5x' .* or 'hf' .*; got 'tx5'"):
        infer(["x"], checkpoint_path="/nonexistent", model=None, method="beam", beam_rules="tx5")


@pytest.mark.parametrize("rules", ["t5x", "hf"])
def test_infer_beam_rules_reach_the_beam_search(monkeypatch, rules):
    """`infer.beam_rules` (gin) is the `rules` the Predictor's beam search runs with."""
    from t5lite.infer import decoding
    from t5lite.infer.predict import Predictor
    seen = []

    def beam_search(module, params, inputs, **kwargs):
        seen.append(kwargs["rules"])
        return decoding.DecodeResult(np.zeros((1, 4, 3), np.int32), np.zeros((1, 4), np.float32))
    monkeypatch.setattr(decoding, "beam_search", beam_search)
    predictor = Predictor(None, None, method="beam", max_decode_length=3, beam_rules=rules)
    predictor._decode(None, {"encoder_input_tokens": np.ones((1, 2), np.int32)}, None)
    assert seen == [rules]
