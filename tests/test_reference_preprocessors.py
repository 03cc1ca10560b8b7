"""t5lite.data.preprocessors against seqio's own (`seqio.preprocessors.rekey` and
`append_eos_after_trim_impl`), run on the same random examples."""
import types

import numpy as np
import pytest

from t5lite.data import preprocessors as P
from t5lite.data.registry import Feature

seqio_preprocessors = pytest.importorskip("seqio.preprocessors", reason="the seqio reference needs the `reference` extra")
tf = pytest.importorskip("tensorflow", reason="the seqio reference needs the `reference` extra")

VOCABULARY = types.SimpleNamespace(eos_id=P.EOS_ID)


def test_rekey_equals_seqios():
    example = {"question": "q", "context": "c", "answers": "a", "id": "7"}
    for key_map in ({"inputs": "question", "targets": "answers"}, {"inputs": "context", "targets": None},
                    {"targets": "", "inputs": "id"}, None, {}):
        out = next(iter(seqio_preprocessors.rekey(tf.data.Dataset.from_tensors(example), key_map)))
        theirs = {k: v.numpy().decode() for k, v in out.items()}
        assert list(P.rekey([dict(example)], key_map)) == [theirs]


@pytest.mark.parametrize("seed", range(5))
def test_append_eos_after_trim_equals_seqios_for_eos_features(seed):
    rng = np.random.default_rng(seed)
    features = {"inputs": Feature(VOCABULARY), "targets": Feature(VOCABULARY)}
    lengths = {"inputs": int(rng.integers(2, 12)), "targets": None if seed == 0 else int(rng.integers(2, 12))}
    for _ in range(20):
        example = {k: rng.integers(3, 50, int(rng.integers(0, 15))).astype(np.int32) for k in features}
        theirs = seqio_preprocessors.append_eos_after_trim_impl(
            {k: tf.constant(v) for k, v in example.items()}, features, lengths)
        ours = next(P.append_eos_after_trim([example], features, lengths))
        assert {k: v.tolist() for k, v in ours.items()} == {k: v.numpy().tolist() for k, v in theirs.items()}
