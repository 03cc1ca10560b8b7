"""Cross entropy with T5X's z-loss and label smoothing, summed over weighted tokens."""
from __future__ import annotations

import jax
import jax.numpy as jnp


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
    target_log_prob = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    if label_smoothing:
        loss = -(confidence * target_log_prob + low * (log_probs.sum(-1) - target_log_prob)) - normalizer
    else:
        loss = -target_log_prob
    z = z_loss * jnp.square(log_z)
    return (loss + z) * weights, z * weights


def token_accuracy_count(logits, targets, weights):
    """Number of weighted positions where the argmax is the target."""
    return jnp.sum((jnp.argmax(logits, -1) == targets) * weights)
