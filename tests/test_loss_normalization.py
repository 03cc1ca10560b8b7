"""T5X's loss_normalizing_factor: the train step's gradient equals the gradient of the objective
written here from its definition, on the whole batch ('global_batch' scope), with and without
gradient accumulation. The 'microbatch' scope is tested against T5X's own accumulation in
tests/test_reference_microbatching.py."""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import shared_data_dir

from t5lite.data import get_task
from t5lite.data.loader import Loader
from t5lite.errors import ConfigError
from t5lite.train import trainer as trainer_lib
from t5lite.objectives import losses
from t5lite.train.partitioning import Partitioner
from t5lite.objectives.base import LossConfig
from t5lite.train.step import TrainTask

LENGTHS = {"inputs": 64, "targets": 8}   # SST-2: a few examples per packed row
Z_LOSS = 1e-4

# Keeps the last gradient as its state and never moves the params: the step's gradient, unrounded.
record_gradient = optax.GradientTransformation(lambda p: jax.tree.map(jnp.zeros_like, p),
                                               lambda g, s, p=None: (jax.tree.map(jnp.zeros_like, g), g))


def reference_objective(logits, batch, factor):
    """The definitions, token by token and sequence by sequence, from T5X's documentation."""
    targets, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"].astype(np.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    token = nll + Z_LOSS * log_z ** 2
    total = jnp.sum(token * weights)
    if factor is None:
        return total
    if factor == "NUM_REAL_TARGET_TOKENS":
        return total / weights.sum()
    if factor == "NUM_TOTAL_TARGET_TOKENS":
        return total / weights.size
    if factor == "AVERAGE_PER_SEQUENCE":
        segments = batch.get("decoder_segment_ids", (weights > 0).astype(np.int32))   # unpacked: one per row
        means = [jnp.sum(token[b] * mask) / mask.sum()
                 for b in range(len(weights)) for s in np.unique(segments[b]) if s > 0
                 for mask in [weights[b] * (segments[b] == s)] if mask.sum() > 0]
        return sum(means) / len(means)
    return total / factor


def train_step_gradient(config, batch, factor, num_microbatches, scope="global_batch"):
    """(the trainer, its initial params, the step's gradient, the step's logged metrics)."""
    trainer = TrainTask(config, record_gradient, optax.constant_schedule(0.0), Partitioner((1, 1, 1)),
                        {k: v.shape[1] for k, v in batch.items()}, LossConfig(Z_LOSS, 0.0, factor, scope),
                        num_microbatches)
    state = trainer.init_state(seed=0)
    with trainer.mesh_context():
        new_state, metrics = trainer.jit_train_step()(jax.tree.map(jnp.copy, state), trainer.partitioner.shard_batch(batch))
    return trainer, state.params, new_state.opt_state, metrics


def _reference_gradient(trainer, params, batch, factor):
    def objective(p):
        logits = trainer.model.apply({"params": p}, **{k: jnp.asarray(v) for k, v in batch.items()})
        return reference_objective(logits, batch, factor)
    return jax.jit(jax.grad(objective))(params)


@pytest.mark.parametrize("factor, pack", [(None, True), (7.0, True), ("NUM_REAL_TARGET_TOKENS", True),
                                          ("NUM_TOTAL_TARGET_TOKENS", True), ("AVERAGE_PER_SEQUENCE", True),
                                          ("AVERAGE_PER_SEQUENCE", False)])
def test_global_batch_scope_matches_the_definition_with_and_without_accumulation(micro_config, factor, pack):
    config = micro_config.replace(dropout_rate=0.0)
    batch = next(iter(Loader(get_task("glue_sst2"), "train", LENGTHS, 4, pack=pack,
                             data_dir=str(shared_data_dir() / "glue"))))
    if pack:
        assert batch["decoder_segment_ids"].max() > 1   # several sequences per row
    trainer, params, grads, _ = train_step_gradient(config, batch, factor, 1)
    expected = _reference_gradient(trainer, params, batch, factor)
    scale = max(np.abs(np.asarray(x)).max() for x in jax.tree.leaves(expected))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5 * scale),
                 grads, expected)
    _, _, accumulated, _ = train_step_gradient(config, batch, factor, 2)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6 * scale),
                 accumulated, grads)


def test_per_sequence_weights_split_packed_rows():
    weights = np.array([[1, 1, 1, 1, 0, 0], [1, 0, 1, 1, 1, 0]], np.float32)
    segments = np.array([[1, 1, 2, 2, 0, 0], [1, 1, 2, 2, 2, 0]])
    expected = np.array([[.5, .5, .5, .5, 0, 0], [1, 0, 1 / 3, 1 / 3, 1 / 3, 0]], np.float32)
    np.testing.assert_allclose(np.asarray(losses.per_sequence_weights(weights, segments)), expected, rtol=1e-6)
    # 4 sequences of total weight 1 each; a sum of thirds is exact only up to float rounding.
    assert float(losses.normalizing_factor("AVERAGE_PER_SEQUENCE", weights, segments)) == pytest.approx(4.0, rel=1e-6)


def test_defaults_are_a_per_token_mean_over_the_whole_batch():
    """t5lite's default factor is a per-token mean (T5X's default is None), counted on the whole
    batch so that microbatching is only a memory setting (T5X's scope is an option)."""
    assert LossConfig().normalizing_factor == "NUM_REAL_TARGET_TOKENS"
    assert LossConfig().normalizing_scope == "global_batch" and not LossConfig().per_microbatch
    defaults = inspect.signature(trainer_lib.train).parameters
    assert defaults["loss_normalizing_factor"].default == "NUM_REAL_TARGET_TOKENS"
    assert defaults["loss_normalizing_scope"].default == "global_batch"
    with pytest.raises(ConfigError, match="loss_normalizing_scope"):
        LossConfig(normalizing_scope="global")


@pytest.mark.parametrize("factor", ["NUM_REAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"])
def test_a_microbatch_without_targets_adds_nothing(factor):
    """T5X divides by a count of 0 there (NaN gradients); t5lite divides by 1."""
    weights = np.zeros((2, 6), np.float32)
    assert float(losses.normalizing_factor(factor, weights, np.zeros((2, 6), np.int32))) == 1.0


@pytest.mark.parametrize("bad", ["num_real", -1.0, 0, True])
def test_bad_normalizing_factor_is_rejected(bad):
    with pytest.raises(ValueError, match="loss_normalizing_factor"):
        LossConfig(normalizing_factor=bad)
