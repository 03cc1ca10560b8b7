"""Feature converters and packing against seqio's own (`seqio.EncDecFeatureConverter`,
`seqio.LMFeatureConverter`, `seqio.PrefixLMFeatureConverter`, `seqio.EncoderFeatureConverter`; pure-TF
packing: `use_custom_packing_ops=False`), run on the same random examples: with `restart_every=max(lengths)` every row and feature equals seqio's; without
it (t5lite's default) the rows differ only where seqio closes a row at a padded-batch boundary."""
import dataclasses
import functools
from typing import Callable

import numpy as np
import pytest

from t5lite.data import converters

seqio = pytest.importorskip("seqio", reason="the seqio reference needs the `reference` extra")
tf = pytest.importorskip("tensorflow", reason="the seqio reference needs the `reference` extra")

LENGTHS = {"inputs": 16, "targets": 8}
MASK = 100   # the encoder examples' mask id, above the random ids


def random_examples(seed, count, keys=("inputs", "targets"), longest=1.0):
    """Non-empty examples of ids >= 2 (seqio reads a padded batch up to its first 0), at most the
    feature's length (seqio's converters check that the task has trimmed them) times `longest`."""
    rng = np.random.default_rng(seed)
    return [{key: rng.integers(2, 100, int(rng.integers(1, int(LENGTHS[key] * longest) + 1))).astype(np.int32) for key in keys}
            for _ in range(count)]


def masked_examples(seed, count, longest=1.0):
    """BERT-style aligned examples: `targets` of ids 2..99, `inputs` the same with about 15% set to MASK."""
    rng = np.random.default_rng(seed)
    examples = []
    for example in random_examples(seed, count, ("inputs",), longest):
        targets = example["inputs"]
        examples.append({"inputs": np.where(rng.random(len(targets)) < 0.15, MASK, targets).astype(np.int32),
                         "targets": targets})
    return examples



def seqio_rows(converter, examples, lengths):
    keys = list(lengths)
    ds = tf.data.Dataset.from_generator(lambda: ({k: e[k] for k in keys} for e in examples),
                                        output_signature={k: tf.TensorSpec([None], tf.int32) for k in keys})
    return [{k: v.numpy() for k, v in row.items()} for row in converter(ds, lengths)]


@dataclasses.dataclass(frozen=True)
class Case:
    """A t5lite converter, seqio's, their task feature lengths and examples that fit them."""
    ours: Callable
    theirs: Callable
    lengths: dict
    examples: Callable = functools.partial(random_examples, keys=("inputs", "targets"))
    # seqio packs in padded batches of max(packed lengths) examples; the prefix LM packs one
    # "targets" of len(inputs) + len(targets).
    restart_every: int = 16

    def __repr__(self):
        return self.ours.func.__name__ if isinstance(self.ours, functools.partial) else self.ours.__name__


CASES = [
    Case(converters.EncDecFeatureConverter, seqio.EncDecFeatureConverter, LENGTHS),
    Case(converters.DecoderOnlyLMFeatureConverter, seqio.LMFeatureConverter, {"targets": 8},
         functools.partial(random_examples, keys=("targets",)), restart_every=8),
    Case(converters.PrefixLMFeatureConverter, seqio.PrefixLMFeatureConverter, LENGTHS, restart_every=24),
    Case(functools.partial(converters.EncoderFeatureConverter, mask_id=MASK),
         functools.partial(seqio.EncoderFeatureConverter, mask_id=MASK), {"inputs": 16, "targets": 16},
         masked_examples),
]


def assert_rows_equal(got, expected):
    """Every feature seqio emits, in every row (t5lite's encoder rows add `token_type_ids`)."""
    got = list(got)
    assert len(got) == len(expected)
    for row, want in zip(got, expected):
        assert {k: row[k].tolist() for k in want} == {k: v.tolist() for k, v in want.items()}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_packed_rows_equal_seqios(seed, case):
    # Several of seqio's padded batches, of short examples, so that its rows close early at their ends.
    examples = case.examples(seed, 3 * case.restart_every + 5, longest=0.4)
    expected = seqio_rows(case.theirs(pack=True, use_custom_packing_ops=False), examples, case.lengths)
    assert_rows_equal(case.ours().convert(examples, case.lengths, pack=True, restart_every=case.restart_every),
                      expected)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_unpacked_rows_equal_seqios(case):
    examples = case.examples(7, 20)
    expected = seqio_rows(case.theirs(pack=False), examples, case.lengths)
    assert_rows_equal(case.ours().convert(examples, case.lengths, pack=False), expected)


def test_default_packing_differs_from_seqio_only_at_its_batch_boundaries():
    """seqio packs 10 two-token examples into rows of 5 as [2, 2], [2, 2], [2] per padded batch of 5
    examples; t5lite's default goes on filling across that boundary."""
    examples = [{"targets": np.array([5, 6], np.int32)} for _ in range(10)]
    lengths = {"targets": 5}
    expected = seqio_rows(seqio.LMFeatureConverter(pack=True, use_custom_packing_ops=False), examples, lengths)
    assert [int(r["decoder_segment_ids"].max()) for r in expected] == [2, 2, 1, 2, 2, 1]
    seqio_like = converters.DecoderOnlyLMFeatureConverter().convert(examples, lengths, pack=True, restart_every=5)
    assert [r["_examples"] for r in seqio_like] == [2, 2, 1, 2, 2, 1]
    default = converters.DecoderOnlyLMFeatureConverter().convert(examples, lengths, pack=True)
    assert [r["_examples"] for r in default] == [2, 2, 2, 2, 2]


def test_an_example_empty_in_one_feature_keeps_its_segment_number_where_seqio_renumbers():
    """seqio numbers each feature's segments from its positions == 0, so an example with empty
    `inputs` gets no encoder segment and the later ones shift down: decoder segment k then
    cross-attends to another example's inputs. t5lite numbers the examples of the row in every
    feature; apart from that numbering its rows equal seqio's."""
    examples = random_examples(11, 12, longest=0.4)
    for k in (1, 5, 6):
        examples[k]["inputs"] = np.zeros(0, np.int32)
    expected = seqio_rows(seqio.EncDecFeatureConverter(pack=True, use_custom_packing_ops=False), examples, LENGTHS)
    got = list(converters.EncDecFeatureConverter().convert(examples, LENGTHS, pack=True, restart_every=16))
    assert len(got) == len(expected)
    first = 0
    for row, want in zip(got, expected):
        for s, example in enumerate(examples[first:first + row["_examples"]], start=1):   # ids name the examples
            assert row["encoder_input_tokens"][row["encoder_segment_ids"] == s].tolist() == example["inputs"].tolist()
            assert row["decoder_target_tokens"][row["decoder_segment_ids"] == s].tolist() == example["targets"].tolist()
        first += row["_examples"]
        same = [k for k in want if k != "encoder_segment_ids"]
        assert {k: row[k].tolist() for k in same} == {k: want[k].tolist() for k in same}
        ours, theirs = row["encoder_segment_ids"], want["encoder_segment_ids"]
        renumbered = np.searchsorted(np.unique(ours[ours > 0]), ours) + 1
        assert np.where(ours > 0, renumbered, 0).tolist() == theirs.tolist()
    assert any(not np.array_equal(r["encoder_segment_ids"], w["encoder_segment_ids"]) for r, w in zip(got, expected))


def test_prefix_lm_empty_targets_get_no_padding_target_where_seqio_adds_one():
    """seqio's prefix LM gives an example with empty `targets` one padding target. Unpacked, its causal
    attention then reaches one pad further. Packed (pure TF), the pad is dropped from the tokens but
    not from the inputs-width features, so the next example's masks shift by one position: its first
    target loses its loss weight. t5lite keeps the example as its inputs alone; the other rows, and
    an example with empty `inputs`, are seqio's."""
    lengths = {"inputs": 4, "targets": 3}
    examples = [{"inputs": np.array([5, 6, 7], np.int32), "targets": np.zeros(0, np.int32)},
                {"inputs": np.zeros(0, np.int32), "targets": np.array([3, 4], np.int32)},
                {"inputs": np.array([8, 9], np.int32), "targets": np.array([3, 4], np.int32)}]
    unpacked = seqio_rows(seqio.PrefixLMFeatureConverter(pack=False), examples, lengths)
    ours = list(converters.PrefixLMFeatureConverter().convert(examples, lengths))
    assert unpacked[0]["decoder_causal_attention"].tolist() == [1, 1, 1, 1, 0, 0, 0]
    assert ours[0]["decoder_causal_attention"].tolist() == [1, 1, 1, 0, 0, 0, 0]
    assert_rows_equal(ours[1:], unpacked[1:])
    packed = seqio_rows(seqio.PrefixLMFeatureConverter(pack=True, use_custom_packing_ops=False), examples, lengths)
    ours = list(converters.PrefixLMFeatureConverter().convert(examples, lengths, pack=True, restart_every=7))
    assert packed[0]["decoder_loss_weights"].tolist() == [0, 0, 0, 0, 1, 0, 0]
    assert ours[0]["decoder_loss_weights"].tolist() == [0, 0, 0, 1, 1, 0, 0]   # both targets of example 2
    tokens = ("decoder_target_tokens", "decoder_input_tokens", "decoder_segment_ids", "decoder_positions")
    assert_rows_equal([{k: row[k] for k in tokens} for row in ours], [{k: row[k] for k in tokens} for row in packed])
    assert_rows_equal(ours[1:], packed[1:])
