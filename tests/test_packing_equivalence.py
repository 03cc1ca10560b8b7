"""A packed batch must give every example exactly the loss it gets when run alone."""
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.data.converters import EncDecFeatureConverter
from t5lite.models import build, get_config
from t5lite.objectives.losses import cross_entropy

from conftest import random_tokens


def _as_batch(row):
    """One converter row as a batch of one (dropping the loader's `_examples` count)."""
    return {k: np.asarray(v)[None] for k, v in row.items() if k != "_examples"}


def _per_token_loss(model, variables, batch):
    features = {k: jnp.asarray(v) for k, v in batch.items()}
    logits = model.apply(variables, **features)
    loss, _ = cross_entropy(logits, features["decoder_target_tokens"], features["decoder_loss_weights"])
    return np.asarray(loss)


def test_packed_loss_equals_one_by_one():
    rng = np.random.default_rng(0)
    examples = [{"inputs": np.append(random_tokens(rng, n), 1), "targets": np.append(random_tokens(rng, m), 1)}
                for n, m in [(9, 4), (5, 7), (12, 3)]]
    lengths = {"inputs": 32, "targets": 20}
    model = build(get_config("t5_tiny", num_encoder_layers=2, num_decoder_layers=2))
    converter = EncDecFeatureConverter()
    packed = list(converter.convert(iter(examples), lengths, pack=True))
    assert len(packed) == 1, "all three examples fit one packed row"
    packed = _as_batch(packed[0])
    variables = model.init(jax.random.key(0), jnp.asarray(packed["encoder_input_tokens"]),
                           jnp.asarray(packed["decoder_input_tokens"]))
    packed_loss = _per_token_loss(model, variables, packed)[0]
    segments = packed["decoder_segment_ids"][0]
    for i, ex in enumerate(examples):
        alone = next(converter.convert(iter([ex]), lengths, pack=False))
        alone_loss = _per_token_loss(model, variables, _as_batch(alone))[0]
        np.testing.assert_allclose(packed_loss[segments == i + 1].sum(), alone_loss.sum(), rtol=1e-5)
        np.testing.assert_allclose(packed_loss[segments == i + 1], alone_loss[: len(ex["targets"])], rtol=1e-4,
                                   atol=1e-5)


def test_packing_changes_loss_if_masks_were_ignored():
    """Guards the test above: without segment ids the same row gives different losses."""
    rng = np.random.default_rng(1)
    examples = [{"inputs": np.append(random_tokens(rng, 8), 1), "targets": np.append(random_tokens(rng, 5), 1)}
                for _ in range(2)]
    lengths = {"inputs": 32, "targets": 20}
    model = build(get_config("t5_tiny", num_encoder_layers=1, num_decoder_layers=1))
    row = _as_batch(next(EncDecFeatureConverter().convert(iter(examples), lengths, pack=True)))
    variables = model.init(jax.random.key(0), jnp.asarray(row["encoder_input_tokens"]),
                           jnp.asarray(row["decoder_input_tokens"]))
    with_masks = _per_token_loss(model, variables, row)
    no_masks = _per_token_loss(model, variables, {k: v for k, v in row.items() if "segment" not in k})
    assert not np.allclose(with_masks, no_masks, atol=1e-4)
