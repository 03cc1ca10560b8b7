"""Input corruption against the upstream functions it names, transcribed here (neither package is
on PyPI):

- google-research/bert, create_pretraining_data.py: `truncate_seq_pair`, driven by the same
  sequence of random draws as t5lite's `_truncate_pair`;
- facebookresearch/SpanBERT, pretraining/fairseq/data/masking.py: `PairWithSpanMaskingScheme.__init__`'s
  span-length distribution (`self.len_distrib`, span_lower 1, span_upper 10, geometric_p 0.2)."""
import numpy as np
import pytest

from t5lite.data.corruption import masking
from t5lite.data.corruption.sentence_pairs import _truncate_pair


class Draws:
    """The same uniform draws for both sides: `random()` as Python's random.Random and numpy's Generator offer it."""

    def __init__(self, seed):
        self._values = iter(np.random.default_rng(seed).random(10_000).tolist())

    def random(self):
        return next(self._values)


def bert_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


@pytest.mark.parametrize("seed", range(50))
def test_truncate_pair_equals_berts_truncate_seq_pair(seed):
    rng = np.random.default_rng(1000 + seed)
    a, b = rng.integers(5, 99, int(rng.integers(1, 40))), rng.integers(5, 99, int(rng.integers(1, 40)))
    if seed % 3 == 0:
        b = rng.integers(5, 99, len(a))              # equal lengths: BERT cuts B first
    max_tokens = int(rng.integers(2, len(a) + len(b) + 2))
    theirs_a, theirs_b = a.tolist(), b.tolist()
    bert_truncate_seq_pair(theirs_a, theirs_b, max_tokens, Draws(seed))
    ours_a, ours_b = _truncate_pair(a, b, max_tokens, Draws(seed))
    assert (ours_a.tolist(), ours_b.tolist()) == (theirs_a, theirs_b)


def test_span_length_distribution_equals_spanberts():
    lower, upper, p = 1, 10, 0.2
    len_distrib = [p * (1 - p) ** (i - lower) for i in range(lower, upper + 1)] if p >= 0 else None
    len_distrib = [x / (sum(len_distrib)) for x in len_distrib]
    np.testing.assert_allclose(masking.span_length_distribution(p, upper), len_distrib, rtol=1e-12)
