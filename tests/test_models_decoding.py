"""Attention masks and incremental decoding: step-by-step logits with the KV cache equal the
full-sequence logits (decoder-only, encoder-decoder, looped and scanned, every position scheme);
prefix LM; padding and packed-segment masks."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import models

from conftest import assert_close, random_variables


def tokens(shape, seed, high=900):
    return jnp.asarray(np.random.RandomState(seed).randint(3, high, shape))


def decode_stepwise(module, params, cache, chunks, step_args):
    @jax.jit
    def step(cache, chunk, extra):
        return module.apply({"params": params, "cache": cache}, **step_args(chunk, extra), decode=True,
                            mutable=["cache"], **({"method": "decode"} if isinstance(module, models.EncoderDecoder)
                                                  else {}))
    out = []
    for chunk, extra in chunks:
        logits, state = step(cache, chunk, extra)
        cache = state["cache"]
        out.append(logits)
    return jnp.concatenate(out, axis=1), cache


_slow = pytest.mark.slow   # the default, rotary, Shaw and scanned variants are their fast siblings
DECODER_VARIANTS = [dict(), dict(position_encoding="rotary"),
                    dict(position_encoding="shaw_relative", shaw_max_distance=3), dict(scan_layers=True),
                    pytest.param(dict(position_encoding="t5_relative"), marks=_slow),
                    pytest.param(dict(position_encoding="sinusoidal"), marks=_slow),
                    pytest.param(dict(position_encoding="disentangled"), marks=_slow),
                    pytest.param(dict(attention_impl="jax"), marks=_slow)]


@pytest.mark.parametrize("overrides", DECODER_VARIANTS,
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "gpt2")
def test_decoder_kv_cache_matches_full_sequence(overrides):
    module = models.build(models.get_config("gpt2_tiny", **overrides))
    variables = random_variables(module, scale=0.2)
    seq = tokens((2, 9), 1)
    full = jax.jit(module.apply)(variables, decoder_input_tokens=seq)
    cache = models.init_cache(module, variables["params"], 9, batch_size=2)
    # A 3-token prompt in one call (prefill), then one token per call.
    chunks = [(seq[:, :3], None)] + [(seq[:, t:t + 1], None) for t in range(3, 9)]
    stepped, cache = decode_stepwise(module, variables["params"], cache, chunks,
                                     step_args=lambda c, _: dict(decoder_input_tokens=c))
    assert_close(stepped, full)
    index = jax.tree.leaves({k: v for k, v in cache["decoder"].items() if k == "index"})
    assert [np.asarray(i).tolist() for i in index] == [[9, 9]]   # one write index per row


@pytest.mark.parametrize("name, overrides", [("t5_tiny", {}), ("t5_1_1_tiny", dict(scan_layers=True)),
                                             ("bart_tiny", {})])
def test_encoder_decoder_kv_cache_matches_full_sequence(name, overrides):
    cfg = models.get_config(name, **overrides)
    module = models.build(cfg)
    variables = random_variables(module, scale=0.2)
    pad = cfg.pad_token_id
    enc = np.array(tokens((2, 10), 2))
    enc[1, 6:] = pad
    enc = jnp.asarray(enc)
    dec = tokens((2, 7), 3)
    full = jax.jit(module.apply)(variables, encoder_input_tokens=enc, decoder_input_tokens=dec)
    encoded = jax.jit(functools.partial(module.apply, method="encode"))(variables, encoder_input_tokens=enc)
    cache = models.init_cache(module, variables["params"], 7, encoded=encoded, encoder_input_tokens=enc)
    chunks = [(dec[:, t:t + 1], None) for t in range(7)]
    # The encoded states are not needed any more: cross-attention reads its cached keys/values.
    stepped, _ = decode_stepwise(module, variables["params"], cache, chunks,
                                 step_args=lambda c, _: dict(encoded=None, encoder_input_tokens=enc,
                                                             decoder_input_tokens=c))
    assert_close(stepped, full)


def test_decodes_of_one_input_share_its_cross_attention_cache():
    """Three decodes per input (samples, beams) read one copy of its encoder keys/values: the
    logits of decoding the inputs repeated three times, with one cross-attention cache row per input."""
    cfg = models.get_config("t5_tiny")
    module = models.build(cfg)
    variables = random_variables(module, scale=0.2)
    enc = np.array(tokens((2, 10), 2))
    enc[1, 6:] = cfg.pad_token_id
    enc = jnp.asarray(enc)
    dec = tokens((6, 5), 3)    # rows 0-2 continue input 0, rows 3-5 input 1
    full = jax.jit(module.apply)(variables, encoder_input_tokens=jnp.repeat(enc, 3, axis=0), decoder_input_tokens=dec)
    encoded = jax.jit(functools.partial(module.apply, method="encode"))(variables, encoder_input_tokens=enc)
    cache = models.init_cache(module, variables["params"], 5, encoded=encoded, encoder_input_tokens=enc, batch_size=6)
    rows = {jax.tree_util.keystr(k): x.shape[0] for k, x in jax.tree_util.tree_leaves_with_path(cache)
            if "attention" in jax.tree_util.keystr(k)}
    assert rows and all(n == (2 if "cross_attention" in k else 6) for k, n in rows.items()), rows
    chunks = [(dec[:, t:t + 1], None) for t in range(5)]
    stepped, _ = decode_stepwise(module, variables["params"], cache, chunks,
                                 step_args=lambda c, _: dict(encoded=None, encoder_input_tokens=enc,
                                                             decoder_input_tokens=c))
    assert_close(stepped, full)


def test_prefix_lm_attention_and_cached_decoding():
    module = models.build(models.get_config("gpt2_tiny", prefix_lm=True))
    variables = random_variables(module, scale=0.2)
    apply = jax.jit(module.apply)
    seq = tokens((1, 8), 4)
    prefix = jnp.asarray([[1, 1, 1, 1, 0, 0, 0, 0]])
    full = apply(variables, decoder_input_tokens=seq, decoder_causal_attention=prefix)
    # Prefix positions see later prefix tokens: changing token 3 changes position 0's output ...
    changed = seq.at[0, 3].set(seq[0, 3] + 1)
    assert np.abs(apply(variables, decoder_input_tokens=changed, decoder_causal_attention=prefix)[0, 0]
                  - full[0, 0]).max() > 1e-3
    # ... but not with a causal mask, and targets never leak into the prefix.
    causal = apply(variables, decoder_input_tokens=seq)
    assert_close(apply(variables, decoder_input_tokens=changed)[0, :3], causal[0, :3], rtol=1e-6)
    later = seq.at[0, 6].set(seq[0, 6] + 1)
    assert_close(apply(variables, decoder_input_tokens=later, decoder_causal_attention=prefix)[0, :6],
                 full[0, :6], rtol=1e-6)
    # Cached: the prefix prefilled in one call, then the targets one at a time.
    cache = models.init_cache(module, variables["params"], 8, batch_size=1)
    chunks = [(seq[:, :4], prefix[:, :4])] + [(seq[:, t:t + 1], prefix[:, t:t + 1]) for t in range(4, 8)]
    stepped, _ = decode_stepwise(module, variables["params"], cache, chunks,
                                 step_args=lambda c, p: dict(decoder_input_tokens=c, decoder_causal_attention=p))
    assert_close(stepped, full)


def test_a_causal_lm_trained_on_prefix_lm_rows_attends_causally_as_it_decodes():
    """The `prefix_lm` converter marks every row's prefix; a decoder that is not a prefix LM
    (T5's "language model" row: inputs + targets, causal) must not see later prefix tokens."""
    module = models.build("gpt2_tiny")
    variables = random_variables(module, scale=0.2)
    seq = tokens((1, 8), 4)
    prefix = jnp.asarray([[1, 1, 1, 1, 0, 0, 0, 0]])
    assert_close(module.apply(variables, decoder_input_tokens=seq, decoder_causal_attention=prefix),
                 module.apply(variables, decoder_input_tokens=seq), rtol=1e-6)


@pytest.mark.parametrize("name", ["bert_tiny", "t5_tiny"])
def test_padding_is_invisible(name):
    cfg = models.get_config(name)
    module = models.build(cfg)
    variables = random_variables(module, scale=0.2)
    encode = jax.jit(functools.partial(module.apply, method="encode"))
    ids = np.array(tokens((1, 6), 5))
    padded = np.concatenate([ids, np.full((1, 4), cfg.pad_token_id)], axis=1)
    assert_close(encode(variables, encoder_input_tokens=padded)[:, :6],
                 encode(variables, encoder_input_tokens=ids))


@pytest.mark.parametrize("name", ["bert_tiny", "gpt2_tiny", "t5_tiny", "bart_tiny"])
def test_packed_segments_equal_separate_examples(name):
    module = models.build(name)
    variables = random_variables(module, scale=0.2)
    apply = jax.jit(module.apply)
    a, b = tokens((1, 5), 6), tokens((1, 3), 7)
    packed = jnp.concatenate([a, b], axis=1)
    segments = jnp.asarray([[1] * 5 + [2] * 3])
    positions = jnp.asarray([list(range(5)) + list(range(3))])
    features = lambda t, s=None, p=None: dict(encoder_input_tokens=t, decoder_input_tokens=t, encoder_segment_ids=s,
                                              decoder_segment_ids=s, encoder_positions=p, decoder_positions=p)
    out = apply(variables, **features(packed, segments, positions))
    assert_close(out[:, :5], apply(variables, **features(a)))
    assert_close(out[:, 5:], apply(variables, **features(b)))


def test_dot_product_attention_impl_matches_einsum():
    cfg = models.get_config("bert_tiny")
    ids = tokens((2, 8), 8)
    a = models.build(cfg)
    variables = random_variables(a, scale=0.2)
    b = models.build(cfg.replace(attention_impl="jax"))
    assert_close(jax.jit(a.apply)(variables, encoder_input_tokens=ids),
                 jax.jit(b.apply)(variables, encoder_input_tokens=ids))


def test_cudnn_attention_impl_asks_jax_for_cudnns_kernel(monkeypatch):
    """attention_impl='cudnn' is the same call with implementation='cudnn' (cuDNN exists on NVIDIA
    GPUs only, so here XLA's kernel stands in for it and the outputs must match einsum's)."""
    asked = []
    xla = jax.nn.dot_product_attention

    def recording(*args, implementation=None, **kwargs):
        asked.append(implementation)
        return xla(*args, implementation=None, **kwargs)
    monkeypatch.setattr(jax.nn, "dot_product_attention", recording)
    cfg = models.get_config("t5_1_1_tiny", dtype="bfloat16")
    ids = tokens((2, 8), 8)
    a = models.build(cfg)
    variables = random_variables(a, scale=0.2)
    out = models.build(cfg.replace(attention_impl="cudnn")).apply(variables, encoder_input_tokens=ids,
                                                                  decoder_input_tokens=ids)
    assert asked and set(asked) == {"cudnn"}
    ref = a.apply(variables, encoder_input_tokens=ids, decoder_input_tokens=ids)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32),
                               atol=0.05 * float(np.abs(np.asarray(ref, np.float32)).max()))
