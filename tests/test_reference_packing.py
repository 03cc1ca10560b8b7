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
