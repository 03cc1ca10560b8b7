"""The train step does no avoidable work: the loss gradient scatters nothing, the relative position
bias is computed once and its gradient is a tree of adds. Structure, not timings.

Each test inspects what XLA or Flax is asked to compute; the numbers themselves are pinned
against references elsewhere (test_interop_hf.py, test_loss_normalization.py).
"""
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.models import build, get_config
from t5lite.models import layers as L
from t5lite.objectives import losses


def test_cross_entropy_gradient_scatters_nothing():
    # take_along_axis's gradient scattered into a zeroed [batch, length, vocab] array.
    logits = jnp.zeros((2, 3, 50), jnp.float32)
    targets = jnp.array([[1, 2, 3], [4, 5, 49]], jnp.int32)
    grad = jax.jit(jax.grad(lambda x, t: jnp.sum(losses.cross_entropy(x, t, 1.0, 1e-4)[0])))
    assert " scatter(" not in grad.lower(logits, targets).compile().as_text()
    # ... and the value is still -log softmax at the target (numpy re-derivation).
    x = np.random.RandomState(0).normal(size=(2, 3, 50)).astype(np.float32)
    log_z = np.log(np.exp(x).sum(-1))
    expected = log_z - np.take_along_axis(x, np.asarray(targets)[..., None], -1)[..., 0]
    np.testing.assert_allclose(losses.cross_entropy(jnp.asarray(x), targets, 1.0)[0], expected, rtol=1e-6)


def _relpos_offset_shapes(features):
    cfg = get_config("t5_tiny", dropout_rate=0.0)
    model = build(cfg)
    variables = model.init(jax.random.PRNGKey(0), **features)
    shapes = []

    def record(next_fun, args, kwargs, context):
        if isinstance(context.module, L.RelativePositionBias):
            shapes.append(args[0].shape)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        logits = model.apply(variables, **features)
    return shapes, logits


def test_relative_position_bias_is_computed_once_for_rows_without_positions():
    batch, enc, dec = 3, 10, 6
    rng = np.random.RandomState(0)
    features = {"encoder_input_tokens": jnp.asarray(rng.randint(2, 100, (batch, enc)), jnp.int32),
                "decoder_input_tokens": jnp.asarray(rng.randint(2, 100, (batch, dec)), jnp.int32)}
    shapes, logits = _relpos_offset_shapes(features)
    assert shapes == [(1, enc, enc), (1, dec, dec)]   # one table per stack, not one per row
    # Explicit positions (packing) keep per-row offsets, and give the same logits for 0, 1, 2, ...
    positioned = {**features, "encoder_positions": jnp.broadcast_to(jnp.arange(enc), (batch, enc)),
                  "decoder_positions": jnp.broadcast_to(jnp.arange(dec), (batch, dec))}
    shapes, same = _relpos_offset_shapes(positioned)
    assert shapes == [(batch, enc, enc), (batch, dec, dec)]
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(same))


def test_shared_position_bias_gradient_is_a_tree_of_adds():
    # The gradient of the [1, heads, q, k] bias broadcast to every row is the sum over rows ...
    rng = np.random.RandomState(0)
    for rows in (1, 2, 3, 5, 8):
        weights = rng.normal(size=(rows, 2, 3, 4)).astype(np.float32)
        grad = jax.grad(lambda x: jnp.sum(L.broadcast_rows(x, rows) * weights))(jnp.zeros((1, 2, 3, 4)))
        np.testing.assert_allclose(grad, weights.sum(0, keepdims=True), rtol=1e-6)
    # ... taken without a reduction over the batch axis of a [batch, heads, q, k] array, which
    # XLA:CPU runs ~40x slower than adds (it cost 0.2 s of a t5_small step).
    batch, enc, dec = 4, 10, 6
    cfg = get_config("t5_tiny", dropout_rate=0.0)
    model = build(cfg)
    features = {"encoder_input_tokens": jnp.asarray(rng.randint(2, 100, (batch, enc)), jnp.int32),
                "decoder_input_tokens": jnp.asarray(rng.randint(2, 100, (batch, dec)), jnp.int32)}
    params = model.init(jax.random.PRNGKey(0), **features)["params"]
    grad = jax.jit(jax.grad(lambda p: jnp.sum(model.apply({"params": p}, **features) ** 2)))
    hlo = grad.lower(params).as_text()
    for length in (enc, dec):
        operand = f"tensor<{batch}x{cfg.num_heads}x{length}x{length}xf32>"
        assert not re.search(rf"across dimensions = \[0\] : \({operand}", hlo), operand


def _attention_reference(x, params, mask, scale, xp=np):
    """Attention re-derived (numpy, or jax.numpy for its gradient): softmax(q k^T * scale + mask) v,
    projected out. Logits are float32, as the model's: NEG_INF then swamps a fully masked row."""
    p = {k: v["kernel"] for k, v in params.items()}
    q, k, v = (xp.einsum("bld,dhk->bhlk", x, p[name]) for name in ("query", "key", "value"))
    logits = (xp.einsum("bhqd,bhkd->bhqk", q, k) * scale).astype(np.float32) + mask
    weights = xp.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return xp.einsum("bhqk,bhkd,hdo->bqo", weights, v, p["out"])


def test_attention_is_softmax_attention_with_masked_rows():
    # Normalising after the weighted sum is still softmax attention, a fully masked query row
    # included (it attends uniformly, as softmax over equal logits does).
    cfg = get_config("t5_tiny", dropout_rate=0.0, scale_attention=True)
    layer = L.MultiHeadAttention(cfg)
    rng = np.random.RandomState(0)
    x = rng.normal(size=(2, 5, cfg.d_model)).astype(np.float32)
    keep = np.ones((2, 5, 5), bool)
    keep[0, :, 3:] = False      # padding keys
    keep[1, 2, :] = False       # a query that may attend nowhere
    mask = np.where(keep, 0.0, L.NEG_INF)[:, None].astype(np.float32)
    params = nn.unbox(layer.init(jax.random.PRNGKey(1), x, x, jnp.asarray(mask))["params"])
    out = layer.apply({"params": params}, x, x, jnp.asarray(mask))
    scale = cfg.head_dim ** -0.5
    as64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    np.testing.assert_allclose(out, _attention_reference(x.astype(np.float64), as64, mask, scale), rtol=2e-4, atol=2e-5)
    # Its gradient too.
    probe = rng.normal(size=out.shape).astype(np.float32)
    ours = jax.grad(lambda p, x: jnp.sum(layer.apply({"params": p}, x, x, jnp.asarray(mask)) * probe), (0, 1))
    reference = jax.grad(lambda p, x: jnp.sum(_attention_reference(x, p, mask, scale, jnp) * probe), (0, 1))
    for a, b in zip(jax.tree.leaves(ours(params, x)), jax.tree.leaves(reference(params, x))):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
