"""Cross entropy with T5X's z-loss and label smoothing, and T5X's loss normalizing factors."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from t5lite.errors import ConfigError


def cross_entropy(logits, targets, weights, z_loss: float = 0.0, label_smoothing: float = 0.0):
    """Per-token loss [batch, length] (weighted) and its z-loss part.

    Label smoothing spreads `label_smoothing` over the other classes and subtracts the entropy
    of that target distribution, so a perfect prediction still scores 0, as in T5X.
    z-loss adds `z_loss * logsumexp(logits)**2` to keep the softmax normaliser near 1.
    """
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab - 1)
    normalizer = -(confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low + 1e-20)) if label_smoothing else 0.0
    log_z = jax.nn.logsumexp(logits, axis=-1)
    log_probs = logits - log_z[..., None]
    # A one-hot sum, not take_along_axis: its gradient fuses into the softmax's instead of
    # scattering into a zeroed [batch, length, vocab] array.
    target_log_prob = jnp.sum(log_probs * jax.nn.one_hot(targets, vocab, dtype=log_probs.dtype), axis=-1)
    if label_smoothing:
        loss = -(confidence * target_log_prob + low * (log_probs.sum(-1) - target_log_prob)) - normalizer
    else:
        loss = -target_log_prob
    z = z_loss * jnp.square(log_z)
    return (loss + z) * weights, z * weights


def token_accuracy_count(logits, targets, weights):
    """Number of weighted positions where the argmax is the target."""
    return jnp.sum((jnp.argmax(logits, -1) == targets) * weights)


# T5X's `loss_normalizing_factor`: what the summed token loss is divided by. A number divides by
# that constant (T5X fine-tunes the original T5 checkpoints with 233472 = 2048 x 114); None
# keeps the sum; these names are counted on the batch the loss is taken over (each microbatch,
# as T5X, or the whole batch: LossConfig.normalizing_scope).
SPECIAL_NORMALIZING_FACTORS = ("NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE")


def check_normalizing_factor(factor) -> None:
    if factor is None or factor in SPECIAL_NORMALIZING_FACTORS:
        return
    if isinstance(factor, (str, bool)) or not isinstance(factor, (int, float)) or factor <= 0:
        raise ConfigError(f"loss_normalizing_factor={factor!r}: expected None, a positive number or one of "
                          f"{SPECIAL_NORMALIZING_FACTORS}")


def per_sequence_weights(weights, segment_ids=None):
    """Each token's weight over the total weight of its sequence (of its packed segment when
    `segment_ids` are given), so that every sequence weighs 1 whatever its length."""
    if segment_ids is None:
        totals = jnp.sum(weights, axis=-1, keepdims=True)
    else:
        def row_totals(w, s):
            return jax.ops.segment_sum(w, s, num_segments=s.shape[0] + 1)[s]
        totals = jax.vmap(row_totals)(weights, segment_ids)
    return jnp.where(totals > 0, weights / jnp.where(totals > 0, totals, 1.0), 0.0)


def objective_weights(factor, weights, segment_ids=None):
    """The per-token weights of the training objective (row-local, so microbatches agree)."""
    return per_sequence_weights(weights, segment_ids) if factor == "AVERAGE_PER_SEQUENCE" else weights


def normalizing_factor(factor, weights, segment_ids=None):
    """The divisor of the summed objective for a batch. Where T5X divides by a count of zero
    (a microbatch without targets) and gets NaN, this divides by 1: the batch adds nothing."""
    if factor is None:
        return jnp.float32(1.0)
    if factor == "NUM_TOTAL_TARGET_TOKENS":
        return jnp.float32(weights.size)
    if factor in ("NUM_REAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"):
        total = jnp.sum(objective_weights(factor, weights, segment_ids)).astype(jnp.float32)
        return jnp.where(total > 0, total, 1.0)
    return jnp.float32(factor)
