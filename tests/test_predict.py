"""`t5lite infer`'s encoding of free text: inputs longer than max_input_length are cut, with a warning."""
import logging

import numpy as np
import pytest

from t5lite.infer.predict import encode_texts


class ByteVocab:
    """One id per UTF-8 byte (+3), so a text's length in tokens is its length in bytes."""

    def encode(self, text):
        return [b + 3 for b in text.encode()]


def test_truncated_inputs_are_warned_about_by_index_and_lengths(caplog):
    texts = ["short", "exactly 7", "a much longer input text"]
    with caplog.at_level(logging.WARNING, logger="t5lite.infer.predict"):
        rows = encode_texts(ByteVocab(), texts, max_length=10, multiple=4, first_index=16)
    long_length = len(texts[2].encode()) + 1  # + EOS
    assert [r.getMessage() for r in caplog.records] == [
        f"input 18 is {long_length} tokens (with EOS), longer than infer.max_input_length=10: truncated to its "
        "first 10 tokens"]
    np.testing.assert_array_equal(rows[2], [b + 3 for b in texts[2].encode()[:9]] + [1])
    np.testing.assert_array_equal(rows[1], [b + 3 for b in texts[1].encode()] + [1])  # 9 + EOS fits exactly
    np.testing.assert_array_equal(rows[0], [b + 3 for b in texts[0].encode()] + [1] + [0] * 4)  # one EOS, then pad


def test_an_unknown_decoding_method_is_a_config_error_before_loading_anything():
    from t5lite.errors import ConfigError
    from t5lite.infer.predict import infer
    with pytest.raises(ConfigError, match="infer.method must be greedy, beam or sample; got 'bam'"):
        infer(["x"], checkpoint_path="/nonexistent", model=None, method="bam")
