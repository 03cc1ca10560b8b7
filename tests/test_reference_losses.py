"""The token loss, its normalising factors and T5's learning-rate schedule against T5X's own code
(t5x is not on PyPI), transcribed below from google-research/t5x:

- t5x/losses.py: `cross_entropy_with_logits` (its custom VJP included), `compute_weighted_cross_entropy`,
  `_sum_weights_per_segment`, `get_loss_normalizing_factor_and_weights`;
- t5x/utils.py: `create_learning_rate_scheduler` with T5's pre-training factors
  ('constant * rsqrt_decay', base_learning_rate 1.0, warmup_steps 10000).

The transcriptions keep T5X's names and arithmetic; only the module prefixes differ (flax's
`common_utils.onehot` is `jax.nn.one_hot` with on/off values)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.objectives import losses
from t5lite.train import optimizers


# ----------------------------------------------------------------------------- t5x/losses.py

@jax.custom_vjp
def t5x_cross_entropy_with_logits(logits, targets, z_loss):
    logits_sum = jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
    log_softmax = logits - logits_sum
    loss = -jnp.sum(targets * log_softmax, axis=-1)
    log_z = jnp.squeeze(logits_sum, axis=-1)
    total_z_loss = z_loss * jax.lax.square(log_z)
    loss += total_z_loss
    return loss, total_z_loss


def _t5x_fwd(logits, targets, z_loss=0.0):
    max_logit = logits.max(axis=-1, keepdims=True)
    shifted = logits - max_logit
    exp_shifted = jnp.exp(shifted)
    sum_exp = jnp.sum(exp_shifted, axis=-1, keepdims=True)
    log_softmax = shifted - jnp.log(sum_exp)
    loss = -jnp.sum(targets * log_softmax, axis=-1)
    log_z = jnp.squeeze(jnp.log(sum_exp) + max_logit, axis=-1)
    total_z_loss = z_loss * jax.lax.square(log_z)
    loss += total_z_loss
    return (loss, total_z_loss), (logits, targets, z_loss, exp_shifted, sum_exp, log_softmax, log_z)


def _t5x_bwd(res, g):
    g = g[0]
    logits, targets, z_loss, exp_shifted, sum_exp, log_softmax, log_z = res
    deriv = jnp.expand_dims(1 + 2 * z_loss * log_z, -1) * exp_shifted / sum_exp - targets
    g_logits = jnp.expand_dims(g, axis=-1) * deriv
    g_targets = -jnp.expand_dims(g, axis=-1) * log_softmax
    return jnp.asarray(g_logits, logits.dtype), jnp.asarray(g_targets, targets.dtype), jnp.array(0.0)


t5x_cross_entropy_with_logits.defvjp(_t5x_fwd, _t5x_bwd)


def t5x_compute_weighted_cross_entropy(logits, targets, weights=None, label_smoothing=0.0, z_loss=0.0,
                                       loss_normalizing_factor=None):
    vocab_size = logits.shape[-1]
    confidence = 1.0 - label_smoothing
    low_confidence = (1.0 - confidence) / (vocab_size - 1)
    normalizing_constant = -(confidence * jnp.log(confidence)
                             + (vocab_size - 1) * low_confidence * jnp.log(low_confidence + 1e-20))
    soft_targets = jax.nn.one_hot(targets, vocab_size) * (confidence - low_confidence) + low_confidence
    total_loss, total_z_loss = t5x_cross_entropy_with_logits(logits, soft_targets, z_loss)
    total_loss = total_loss - normalizing_constant
    weight_sum = np.prod(targets.shape)
    if weights is not None:
        total_loss = total_loss * weights
        total_z_loss = total_z_loss * weights
        weight_sum = jnp.sum(weights)
    if loss_normalizing_factor is not None:
        total_loss /= loss_normalizing_factor
        total_z_loss /= loss_normalizing_factor
    return jnp.sum(total_loss), jnp.sum(total_z_loss), weight_sum


@jax.vmap
def t5x_sum_weights_per_segment(positions, segment_ids, weights):
    def _repeat_last_nonnegative(xs, reverse=False):
        def fn(prev, x):
            y = jnp.where(x == 0, prev, x)
            return y, y
        return jax.lax.scan(fn, jnp.zeros_like(xs[0]), xs, reverse=reverse)[1]

    start_positions = positions == 0
    final_positions = jnp.concatenate([start_positions[1:], jnp.ones(1)])
    final_positions *= segment_ids != 0
    final_cumulative_weights = final_positions * jnp.cumsum(weights)
    final_total_weights = jnp.concatenate([final_cumulative_weights[0:1],
                                           jnp.diff(_repeat_last_nonnegative(final_cumulative_weights))])
    return _repeat_last_nonnegative(final_total_weights, reverse=True)


def t5x_get_loss_normalizing_factor_and_weights(loss_normalizing_factor, batch):
    loss_weights = batch.get("decoder_loss_weights", None)
    if loss_normalizing_factor is None or not isinstance(loss_normalizing_factor, str):
        return loss_normalizing_factor, loss_weights
    if loss_normalizing_factor == "NUM_REAL_TARGET_TOKENS":
        output_normalizing_factor = jnp.sum(loss_weights)
    elif loss_normalizing_factor == "NUM_TOTAL_TARGET_TOKENS":
        output_normalizing_factor = np.prod(batch["decoder_target_tokens"].shape)
    elif loss_normalizing_factor == "AVERAGE_PER_SEQUENCE":
        if "decoder_segment_ids" in batch:
            norm_vec = t5x_sum_weights_per_segment(batch["decoder_positions"], batch["decoder_segment_ids"],
                                                   loss_weights)
        else:
            norm_vec = jnp.sum(loss_weights, axis=-1, keepdims=True)
        loss_weights = jnp.nan_to_num(loss_weights / norm_vec, nan=0, posinf=0, neginf=0)
        output_normalizing_factor = jnp.sum(loss_weights)
    else:
        raise ValueError(loss_normalizing_factor)
    return output_normalizing_factor, loss_weights


# ----------------------------------------------------------------------------- inputs

def packed_batch(seed, rows=3, length=12, vocab=17):
    """Packed rows: segments of random lengths, padding at the end, loss weights 1 on real tokens."""
    rng = np.random.default_rng(seed)
    segment_ids, positions = np.zeros((rows, length), np.int32), np.zeros((rows, length), np.int32)
    for r in range(rows):
        start, segment = 0, 1
        while start < length - 2:
            n = int(rng.integers(1, 5))
            end = min(start + n, length - int(rng.integers(0, 3)))
            if end <= start:
                break
            segment_ids[r, start:end], positions[r, start:end] = segment, np.arange(end - start)
            start, segment = end, segment + 1
    weights = (segment_ids > 0).astype(np.float32)
    targets = np.where(weights > 0, rng.integers(1, vocab, (rows, length)), 0).astype(np.int32)
    logits = (rng.normal(size=(rows, length, vocab)) * 3).astype(np.float32)
    return logits, {"decoder_target_tokens": targets, "decoder_loss_weights": weights,
                    "decoder_segment_ids": segment_ids, "decoder_positions": positions}


# ----------------------------------------------------------------------------- tests

@pytest.mark.parametrize("z_loss, label_smoothing", [(0.0, 0.0), (1e-4, 0.0), (0.0, 0.1), (1e-2, 0.2)])
def test_cross_entropy_and_its_gradient_equal_t5xs(z_loss, label_smoothing):
    logits, batch = packed_batch(0)
    targets, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"]

    def ours(x):
        loss, z = losses.cross_entropy(x, targets, weights, z_loss, label_smoothing)
        return jnp.sum(loss), jnp.sum(z)

    def theirs(x):
        loss, z, _ = t5x_compute_weighted_cross_entropy(x, targets, weights, label_smoothing, z_loss)
        return loss, z

    np.testing.assert_allclose(np.array(ours(logits)), np.array(theirs(logits)), rtol=2e-6)
    np.testing.assert_allclose(jax.grad(lambda x: ours(x)[0])(logits), jax.grad(lambda x: theirs(x)[0])(logits),
                               rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("factor", [None, 233472.0, "NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS",
                                    "AVERAGE_PER_SEQUENCE"])
@pytest.mark.parametrize("packed", [True, False])
def test_normalised_loss_equals_t5xs(factor, packed):
    """What T5X's `loss_fn` computes: the weights and factor from `get_loss_normalizing_factor_and_weights`,
    then `compute_weighted_cross_entropy` with them."""
    for seed in range(4):
        logits, batch = packed_batch(seed)
        if not packed:
            batch = {k: v for k, v in batch.items() if k in ("decoder_target_tokens", "decoder_loss_weights")}
        t5x_factor, t5x_weights = t5x_get_loss_normalizing_factor_and_weights(factor, batch)
        theirs, _, _ = t5x_compute_weighted_cross_entropy(logits, batch["decoder_target_tokens"], t5x_weights,
                                                          z_loss=1e-4, loss_normalizing_factor=t5x_factor)
        weights, segment_ids = batch["decoder_loss_weights"], batch.get("decoder_segment_ids")
        token_loss, _ = losses.cross_entropy(logits, batch["decoder_target_tokens"], 1.0, 1e-4)
        ours = (jnp.sum(token_loss * losses.objective_weights(factor, weights, segment_ids))
                / losses.normalizing_factor(factor, weights, segment_ids))
        np.testing.assert_allclose(float(ours), float(theirs), rtol=2e-6)


def test_rsqrt_decay_equals_t5xs_scheduler_with_t5s_factors():
    def t5x_step_fn(step, factors="constant * rsqrt_decay", base_learning_rate=1.0, warmup_steps=10000,
                    step_offset=0, min_learning_rate=1e-8):
        step = jnp.maximum(0, step - step_offset)
        ret = 1.0
        for name in [n.strip() for n in factors.split("*")]:
            if name == "constant":
                ret *= base_learning_rate
            elif name == "rsqrt_decay":
                ret /= jnp.sqrt(jnp.maximum(step, warmup_steps))
        ret = jnp.maximum(ret, min_learning_rate)
        return jnp.asarray(ret, dtype=jnp.float32)

    steps = np.array([0, 1, 9_999, 10_000, 10_001, 40_000, 524_288, 10**9])
    np.testing.assert_allclose(np.array([optimizers.rsqrt_decay()(s) for s in steps]),
                               np.array([t5x_step_fn(s) for s in steps]), rtol=1e-6)
