"""Gradient accumulation with `train.loss_normalizing_scope = 'microbatch'` against T5X's own code
(t5x is not on PyPI), transcribed below from google-research/t5x:

- t5x/trainer.py: `accumulate_grads_microbatched` (its `get_microbatch`, the summed gradients and
  the metrics merged over microbatches);
- t5x/models.py: `BaseTransformerModel.loss_fn`, with the 'accuracy' and
  'loss_per_nonpadding_target_token' entries of `compute_base_metrics` (clu `Average`s, kept as
  (total, count) and merged by adding both, as clu's `Average.merge`);
- t5x/losses.py: `compute_weighted_cross_entropy` and `get_loss_normalizing_factor_and_weights`,
  transcribed in tests/test_reference_losses.py.

The batch is real packed SST-2 whose loss weights differ between T5X's microbatches, so a grouping
of rows other than T5X's gives another gradient."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import shared_data_dir
from test_loss_normalization import LENGTHS, Z_LOSS, train_step_gradient
from test_reference_losses import t5x_compute_weighted_cross_entropy, t5x_get_loss_normalizing_factor_and_weights

from t5lite.data import get_task
from t5lite.data.loader import Loader

NUM_MICROBATCHES = 2


# ----------------------------------------------------------------------------- t5x/models.py

def t5x_loss_fn(compute_logits, loss_normalizing_factor, z_loss):
    """`BaseTransformerModel.loss_fn` of a model built with `loss_normalizing_factor` and `z_loss`."""
    def loss_fn(params, batch, dropout_rng):
        logits = compute_logits(params, batch, dropout_rng)
        (loss_normalizing_factor_, weights) = t5x_get_loss_normalizing_factor_and_weights(
            loss_normalizing_factor, batch)
        loss, z_loss_, _ = t5x_compute_weighted_cross_entropy(
            logits, targets=batch["decoder_target_tokens"], weights=weights, label_smoothing=0.0,
            z_loss=z_loss, loss_normalizing_factor=loss_normalizing_factor_)
        # compute_base_metrics(logits, targets, mask=weights, loss, z_loss, segment_ids)
        targets, mask = batch["decoder_target_tokens"], weights
        nonpadding_tokens = jnp.sum(mask)
        metrics = {"accuracy": (jnp.sum((logits.argmax(axis=-1) == targets) * mask), jnp.sum(mask)),
                   "loss_per_nonpadding_target_token": (loss, nonpadding_tokens)}
        return loss, metrics
    return loss_fn


# ----------------------------------------------------------------------------- t5x/trainer.py

def merge_metrics(a, b):
    return jax.tree.map(jnp.add, a, b)


def t5x_accumulate_grads_microbatched(loss_fn, params, batch, dropout_rng, num_microbatches):
    batch_size = next(iter(batch.values())).shape[0]
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    assert batch_size % num_microbatches == 0, "Batch size isn't divided evenly by num_microbatches."
    microbatch_size = batch_size // num_microbatches

    def get_microbatch(batch, idx):
        """Fetch microbatch slice from possibly-packed input data."""
        offset = idx * microbatch_size
        length = microbatch_size
        starts = {k: [offset] + [0] * (b.ndim - 1) for k, b in batch.items()}
        limits = {k: [length] + list(b.shape[1:]) for k, b in batch.items()}
        return {k: jax.lax.dynamic_slice(b, starts[k], limits[k]) for k, b in batch.items()}

    def metrics_and_grad(loop_cnt, dropout_rng):
        dropout_rng, sub_dropout_rng = jax.random.split(dropout_rng)
        mbatch = get_microbatch(batch, loop_cnt)
        (_, metrics), grad = grad_fn(params, mbatch, sub_dropout_rng)
        return metrics, grad

    def per_microbatch_train_step(loop_cnt, state):
        (dropout_rng, grad_accum, prev_metrics) = state
        metrics, grad = metrics_and_grad(loop_cnt, dropout_rng)
        grad_accum = jax.tree.map(jnp.add, grad_accum, grad)
        metrics = jax.lax.cond(loop_cnt == 0, lambda _: metrics, lambda _: merge_metrics(prev_metrics, metrics), None)
        return dropout_rng, grad_accum, metrics

    accum_dtype = jnp.float32
    grad_accum_init = jax.tree.map(lambda x: jnp.zeros(x.shape, accum_dtype), params)
    initial_metrics_shape, _ = jax.eval_shape(metrics_and_grad, loop_cnt=0, dropout_rng=dropout_rng)
    initial_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), initial_metrics_shape)
    loop_init = (dropout_rng, grad_accum_init, initial_metrics)
    _, grad_accum, metrics = jax.lax.fori_loop(0, num_microbatches, per_microbatch_train_step, loop_init)
    return grad_accum, metrics


# ----------------------------------------------------------------------------- the comparison

@pytest.fixture(scope="module")
def uneven_batch():
    """4 packed SST-2 rows (the first holds two examples) with the last row's final target
    unweighted: T5X's microbatches (rows 0-1, rows 2-3) weigh 6 and 3 tokens."""
    batch = next(iter(Loader(get_task("glue_sst2"), "train", LENGTHS, 4, pack=True,
                             data_dir=str(shared_data_dir() / "glue"))))
    weights = batch["decoder_loss_weights"]
    weights[3, np.flatnonzero(weights[3])[-1]] = 0
    assert weights[:2].sum() != weights[2:].sum()
    return batch


@pytest.mark.parametrize("factor", ["NUM_REAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE", None])
def test_microbatch_scope_gives_t5xs_accumulated_gradient_and_metrics(micro_config, uneven_batch, factor):
    trainer, params, grads, metrics = train_step_gradient(micro_config.replace(dropout_rate=0.0), uneven_batch,
                                                          factor, NUM_MICROBATCHES, scope="microbatch")

    def compute_logits(p, batch, dropout_rng):
        return trainer.model.apply({"params": p}, **batch)
    loss_fn = t5x_loss_fn(compute_logits, factor, Z_LOSS)
    expected, t5x_metrics = jax.jit(t5x_accumulate_grads_microbatched, static_argnums=(0, 4))(
        loss_fn, params, {k: jnp.asarray(v) for k, v in uneven_batch.items()}, jax.random.key(0), NUM_MICROBATCHES)
    scale = max(float(np.abs(np.asarray(x)).max()) for x in jax.tree.leaves(expected))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5 * scale),
                 grads, expected)
    if factor is None:   # T5X's per-token metrics; t5lite logs those whatever the factor
        for name, t5x_name in [("loss", "loss_per_nonpadding_target_token"), ("accuracy", "accuracy")]:
            total, count = t5x_metrics[t5x_name]
            assert float(metrics[name]) == pytest.approx(float(total / count), rel=1e-5)
