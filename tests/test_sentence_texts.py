"""Bi-encoder inputs: the no-duplicates batches (a property test: no text twice in a batch, every
row used once, as sentence-transformers' NoDuplicatesBatchSampler on the same rows), the
`sentence_texts` converter's features, and SQuAD pairs where a paragraph is asked about many times."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from t5lite.data import converters
from t5lite.data.loader import Loader
from t5lite.data.sentence_texts import SentenceTextsConverter, no_duplicate_batches
from t5lite.errors import ConfigError

from conftest import shared_data_dir


def _rows(pairs):
    return [{"text0_input_tokens": np.array([a, 0], np.int32), "text1_input_tokens": np.array([b, 0], np.int32),
             "label": np.zeros(1, np.float32), converters.EXAMPLES_KEY: 1, "row": np.int32(i)}
            for i, (a, b) in enumerate(pairs)]


def _sentence_transformers_batches(pairs, batch_size, drop_last):
    """sentence-transformers' NoDuplicatesBatchSampler over the rows in order (its loop, no shuffle)."""
    remaining = dict.fromkeys(range(len(pairs)))
    while remaining:
        values, batch = set(), []
        for index in remaining:
            texts = {("t", pairs[index][0]), ("t", pairs[index][1])}
            if texts & values:
                continue
            batch.append(index)
            if len(batch) == batch_size:
                yield batch
                break
            values.update(texts)
        else:
            if not drop_last and batch:
                yield batch
        for index in batch:
            del remaining[index]


@settings(max_examples=200, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 8)), min_size=1, max_size=40),
       batch_size=st.integers(1, 6), drop_remainder=st.booleans())
def test_no_duplicate_batches(pairs, batch_size, drop_remainder):
    batches = list(no_duplicate_batches(_rows(pairs), batch_size, drop_remainder))
    used = []
    for b in batches:
        texts = np.concatenate([b["text0_input_tokens"][:, 0], b["text1_input_tokens"][:, 0]])
        # no text twice across the rows of a batch (a row may pair a text with itself)
        per_row = [set(t) for t in zip(b["text0_input_tokens"][:, 0], b["text1_input_tokens"][:, 0])]
        assert sum(len(s) for s in per_row) == len(set(texts.tolist()))
        assert b[converters.EXAMPLES_KEY] == len(b["row"])
        assert drop_remainder is False or len(b["row"]) == batch_size
        used += b["row"].tolist()
    assert len(used) == len(set(used))
    if not drop_remainder:
        assert sorted(used) == list(range(len(pairs)))
    ours = [b["row"].tolist() for b in batches]
    assert ours == list(_sentence_transformers_batches(pairs, batch_size, drop_remainder))


def test_squad_batches_never_repeat_a_paragraph():
    """SQuAD dev asks ~5 questions per paragraph; plain batching would put the same paragraph in a
    batch as its own negative, the converter's batches never do."""
    from t5lite.data import get_task
    from t5lite.data.vocab import set_default_vocabulary
    set_default_vocabulary(None)
    task = get_task("sentence_squad_v1")
    lengths = {"text0": 16, "text1": 32}
    loader = Loader(task, "validation", lengths, 32, "sentence_texts", pack=False, shuffle=False,
                    data_dir=str(shared_data_dir() / "squad" / "v1.1"))
    plain = converters.batch(SentenceTextsConverter().convert(
        task.get_dataset("validation", lengths, data_dir=str(shared_data_dir() / "squad" / "v1.1")), lengths), 32)
    repeated = lambda b: len({r.tobytes() for r in b["text1_input_tokens"]}) < len(b["text1_input_tokens"])
    assert repeated(next(plain))
    for _, batch in zip(range(5), loader):
        assert batch["text1_input_tokens"].shape == (32, 32) and not repeated(batch)


def test_converter_features_and_lengths():
    converter = SentenceTextsConverter(no_duplicates=False)
    lengths = {"text0": 4, "text1": 6, "text2": 5}
    assert converter.model_feature_lengths(lengths) == {"text0_input_tokens": 4, "text1_input_tokens": 6,
                                                        "text2_input_tokens": 5, "label": 1}
    (row,) = converter.convert([{"text0": [5, 6], "text1": [7, 8, 9], "text2": [3], "label": 0.4}], lengths)
    np.testing.assert_array_equal(row["text1_input_tokens"], [7, 8, 9, 0, 0, 0])
    assert row["label"].dtype == np.float32 and row["label"][0] == pytest.approx(0.4)
    with pytest.raises(ConfigError, match="text0"):
        converter.model_feature_lengths({"inputs": 8})
    with pytest.raises(ConfigError, match="pack"):
        list(converter.convert([], lengths, pack=True))
