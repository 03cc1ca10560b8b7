"""Feature converters and packing against seqio's own (`seqio.EncDecFeatureConverter`,
`seqio.LMFeatureConverter`, pure-TF packing: `use_custom_packing_ops=False`), run on the same
random examples: with `restart_every=max(lengths)` every row and feature equals seqio's; without
it (t5lite's default) the rows differ only where seqio closes a row at a padded-batch boundary."""
import numpy as np
import pytest

from t5lite.data import converters

seqio = pytest.importorskip("seqio", reason="the seqio reference needs the `reference` extra")
tf = pytest.importorskip("tensorflow", reason="the seqio reference needs the `reference` extra")

LENGTHS = {"inputs": 16, "targets": 8}


def random_examples(seed, count, keys=("inputs", "targets"), longest=1.0):
    """Non-empty examples of ids >= 2 (seqio reads a padded batch up to its first 0), at most the
    feature's length (seqio's converters check that the task has trimmed them) times `longest`."""
    rng = np.random.default_rng(seed)
    return [{key: rng.integers(2, 100, int(rng.integers(1, int(LENGTHS[key] * longest) + 1))).astype(np.int32) for key in keys}
            for _ in range(count)]


def seqio_rows(converter, examples, lengths):
    keys = list(lengths)
    ds = tf.data.Dataset.from_generator(lambda: ({k: e[k] for k in keys} for e in examples),
                                        output_signature={k: tf.TensorSpec([None], tf.int32) for k in keys})
    return [{k: v.numpy() for k, v in row.items()} for row in converter(ds, lengths)]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("ours, theirs, keys", [
    (converters.EncDecFeatureConverter, seqio.EncDecFeatureConverter, ("inputs", "targets")),
    (converters.DecoderOnlyLMFeatureConverter, seqio.LMFeatureConverter, ("targets",)),
])
def test_packed_rows_equal_seqios(seed, ours, theirs, keys):
    lengths = {k: LENGTHS[k] for k in keys}
    # Several of seqio's padded batches, of short examples, so that its rows close early at their ends.
    examples = random_examples(seed, 3 * max(lengths.values()) + 5, keys, longest=0.4)
    expected = seqio_rows(theirs(pack=True, use_custom_packing_ops=False), examples, lengths)
    got = list(ours().convert(examples, lengths, pack=True, restart_every=max(lengths.values())))
    assert len(got) == len(expected)
    for row, want in zip(got, expected):
        assert {k: row[k].tolist() for k in want} == {k: v.tolist() for k, v in want.items()}


@pytest.mark.parametrize("ours, theirs, keys", [
    (converters.EncDecFeatureConverter, seqio.EncDecFeatureConverter, ("inputs", "targets")),
    (converters.DecoderOnlyLMFeatureConverter, seqio.LMFeatureConverter, ("targets",)),
])
def test_unpacked_rows_equal_seqios(ours, theirs, keys):
    lengths = {k: LENGTHS[k] for k in keys}
    examples = random_examples(7, 20, keys)
    expected = seqio_rows(theirs(pack=False), examples, lengths)
    got = list(ours().convert(examples, lengths, pack=False))
    for row, want in zip(got, expected, strict=True):
        assert {k: row[k].tolist() for k in want} == {k: v.tolist() for k, v in want.items()}


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
