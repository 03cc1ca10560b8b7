"""Longformer's windowed attention (t5lite.models.windowed_attention): blockwise banded attention equals
dense softmax attention under the band mask written out here (padding, packed segments, dilation,
causality, global keys, position biases); a model with a window covering the row equals the full-attention
model; and t5lite's attention equals Hugging Face's `LongformerSelfAttention` on the same weights."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close
from t5lite.errors import ConfigError
from t5lite.models import get_config
from t5lite.models import layers as L
from t5lite.models import windowed_attention as W
from t5lite.models.transformer import build_module

RTOL = 2e-5


def _rows(rng, b, n, packed):
    """Padding at the ends of rows; with `packed`, two or three examples per row whose positions restart."""
    mask = np.arange(n)[None] < rng.integers(n // 2, n + 1, size=(b, 1))
    mask[0] = True
    if not packed:
        return mask, None, np.broadcast_to(np.arange(n), (b, n))
    cuts = np.sort(rng.choice(np.arange(1, n), size=(b, 2)), axis=1)
    segments = 1 + (np.arange(n)[None] >= cuts[:, :1]) + (np.arange(n)[None] >= cuts[:, 1:])
    starts = np.where(segments == 1, 0, np.where(segments == 2, cuts[:, :1], cuts[:, 1:]))
    return mask, segments * mask, (np.arange(n)[None] - starts) * mask


def _dense_reference(q, k, v, mask, segments, positions, window, dilation, causal, is_global, table):
    """Softmax attention over all keys, restricted to Longformer's band: query i sees key j when
    |i - j| <= dilation * window / 2 and dilation divides i - j, or when j is global; never padding,
    another packed example or (causal) a later key; plus table[key position - query position] per head."""
    n = q.shape[1]
    i, j = np.arange(n)[:, None], np.arange(n)[None]
    band = (np.abs(i - j) <= dilation * (window // 2)) & ((i - j) % dilation == 0)
    allowed = (band[None] | is_global[:, None, :]) & mask[:, None, :]
    if segments is not None:
        allowed &= segments[:, :, None] == segments[:, None, :]
    if causal:
        allowed &= j <= i
    logits = np.einsum("bqhd,bkhd->bhqk", q, k)
    if table is not None:
        offsets = np.clip(positions[:, None, :] - positions[:, :, None], -8, 8) + 8
        logits = logits + table[offsets].transpose(0, 3, 1, 2)
    logits = np.where(allowed[:, None], logits, -1e30)   # (padding queries see nothing: not compared)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", weights / weights.sum(-1, keepdims=True), v)


CASES = [  # n, window, dilation, causal, packed, global tokens, position table
    (13, 2, 1, False, False, 0, False),
    (32, 4, 1, False, True, 0, True),
    (50, 6, 2, False, True, 3, True),
    (29, 4, 3, True, True, 0, True),
    (40, 8, 1, True, False, 2, False),
    (37, 10, 1, False, False, 4, True),
]


@pytest.mark.parametrize("n,window,dilation,causal,packed,num_global,bias", CASES)
def test_banded_attention_equals_dense_attention_under_the_band_mask(n, window, dilation, causal, packed,
                                                                      num_global, bias):
    rng = np.random.default_rng(n)
    b, h, d = 3, 2, 8
    q, k, v = (rng.normal(size=(b, n, h, d)).astype(np.float32) for _ in range(3))
    mask, segments, positions = _rows(rng, b, n, packed)
    is_global = np.zeros((b, n), bool)
    for row in range(b):
        is_global[row, rng.choice(np.flatnonzero(mask[row]), size=num_global, replace=False)] = True
    table = rng.normal(size=(17, h)).astype(np.float32) if bias else None
    position_bias = (lambda off: jnp.asarray(table)[jnp.clip(off, -8, 8) + 8].transpose(0, 3, 1, 2)) if bias else None
    slots = W.make_slots(jnp.asarray(mask), None if segments is None else jnp.asarray(segments), jnp.asarray(positions))
    biases, = W.stack_biases(window, dilation, 1, slots, causal, jnp.asarray(is_global) if num_global else None,
                             max(num_global, 1), position_bias)
    out = W.banded_attention(*(jnp.asarray(x) for x in (q, k, v)), biases)
    ref = _dense_reference(q, k, v, mask, segments, positions, window, dilation, causal, is_global, table)
    queries = mask & ~is_global      # global queries take their own projections: test_hf_parity covers them
    assert_close(np.asarray(out)[queries], ref[queries], RTOL)
    fused = W.banded_attention(*(jnp.asarray(x) for x in (q, k, v)), biases,   # accelerators' path
                               functools.partial(W.dense_attention, impl="jax"))
    assert_close(np.asarray(fused)[queries], ref[queries], RTOL)
    # memory grows with n x window: the biases hold about 3 x block keys per query, never n
    assert biases.local.shape[-1] == 3 * W.block_size(window, dilation) + biases.global_index.shape[1]


def test_an_off_by_one_band_is_caught():
    """The comparison above fails on a band one slot too narrow (a broken implementation)."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 24, 2, 8)).astype(np.float32) for _ in range(3))
    mask, no_global = np.ones((2, 24), bool), np.zeros((2, 24), bool)
    biases, = W.stack_biases(4, 1, 1, W.make_slots(jnp.asarray(mask)), False, None, 1)
    out = np.asarray(W.banded_attention(*(jnp.asarray(x) for x in (q, k, v)), biases))
    ref = functools.partial(_dense_reference, q, k, v, mask, None, None, dilation=1, causal=False,
                            is_global=no_global, table=None)
    assert_close(out, ref(window=4), RTOL)
    with pytest.raises(AssertionError):
        assert_close(out, ref(window=2), RTOL)


@pytest.fixture(scope="module")
def packed_t5_features():
    rng = np.random.default_rng(1)
    tokens = rng.integers(2, 900, size=(2, 40)).astype(np.int32)
    segments = np.where(np.arange(40)[None] < np.array([[25], [17]]), 1, 2).astype(np.int32)
    positions = np.where(segments == 1, np.arange(40), np.arange(40) - np.array([[25], [17]])).astype(np.int32)
    tokens[1, 36:] = 0
    segments[1, 36:], positions[1, 36:] = 0, 0
    return dict(encoder_input_tokens=tokens, decoder_input_tokens=tokens, encoder_segment_ids=segments,
                decoder_segment_ids=segments, encoder_positions=positions, decoder_positions=positions)


@pytest.mark.parametrize("name", ["t5_tiny", "gpt2_tiny", "bert_tiny"])
def test_a_window_over_the_whole_row_is_full_attention(name, packed_t5_features):
    """Every family's positions (T5's relative buckets, learned tables), packing, padding, causality:
    a window wider than the row gives the full-attention model's outputs; a narrow one does not."""
    config = get_config(name, dropout_rate=0.0)
    features = {k: jnp.asarray(v) for k, v in packed_t5_features.items()}
    params = build_module(config.replace(attention_window=80)).init(jax.random.PRNGKey(0), **features)["params"]
    run = lambda cfg: np.asarray(jax.jit(build_module(cfg).apply)({"params": params}, **features))
    full = run(config)
    kept = packed_t5_features["encoder_segment_ids"] > 0
    assert_close(run(config.replace(attention_window=80))[kept], full[kept], RTOL)
    if name == "t5_tiny":   # per-layer windows narrower than the row do change it
        assert not np.allclose(run(config.replace(attention_window=(4, 8)))[kept], full[kept], atol=1e-3)


def test_config_refuses_windows_it_cannot_run():
    with pytest.raises(ConfigError, match="attention_window=3: expected positive even ints"):
        get_config("bert_tiny", attention_window=3)
    with pytest.raises(ConfigError, match="has 3 entries for stacks of \\[2\\] layers"):
        get_config("bert_tiny", attention_window=(4, 4, 4))
    with pytest.raises(ConfigError, match="does not combine with position_encoding='disentangled'"):
        get_config("deberta_v3_tiny", attention_window=4)
    with pytest.raises(ConfigError, match="scan_layers=True"):
        get_config("bert_tiny", attention_window=(4, 8), scan_layers=True)


# ----------------------------------------------------------------------------- Hugging Face parity

def _hf_longformer_attention(window, hidden=32, heads=4):
    transformers = pytest.importorskip("transformers", reason="parity tests need transformers (extras 'hf')")
    torch = pytest.importorskip("torch", reason="parity tests need the optional torch dependency (extras 'hf')")
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention
    torch.manual_seed(0)
    config = transformers.LongformerConfig(hidden_size=hidden, num_attention_heads=heads, attention_window=[window],
                                           attention_probs_dropout_prob=0.0)
    attention = LongformerSelfAttention(config, layer_id=0).eval()
    with torch.no_grad():
        for p in attention.parameters():
            p.normal_(0, 0.3)
    return torch, attention


def _our_attention_params(attention, hidden, heads):
    """LongformerSelfAttention's Linear layers as t5lite's dense kernels [in, heads, head_dim], with an
    identity output projection (Hugging Face applies its own in LongformerSelfOutput)."""
    shape = (heads, hidden // heads)
    dense = lambda lin: dict(kernel=jnp.asarray(lin.weight.detach().numpy().T.reshape((hidden,) + shape)),
                             bias=jnp.asarray(lin.bias.detach().numpy().reshape(shape)))
    names = ("query", "key", "value", "query_global", "key_global", "value_global")
    params = {name: dense(getattr(attention, name)) for name in names}
    params["out"] = dict(kernel=jnp.eye(hidden).reshape(shape + (hidden,)), bias=jnp.zeros(hidden))
    return params


@pytest.mark.parametrize("window,globals_per_row", [(4, ((0, 5), (0,))), (6, ((), ())), (8, ((3, 9, 10), (1, 2)))])
def test_hf_parity(window, globals_per_row):
    """Windowed and global positions, with padding: t5lite's attention gives LongformerSelfAttention's outputs."""
    hidden, heads, n = 32, 4, window * max(4, 16 // window)
    torch, attention = _hf_longformer_attention(window, hidden, heads)
    rng = np.random.default_rng(window)
    x = rng.normal(size=(2, n, hidden)).astype(np.float32)
    mask = np.ones((2, n), bool)
    mask[1, n - window - 1:] = False
    is_global = np.zeros((2, n), bool)
    for row, slots in enumerate(globals_per_row):
        is_global[row, list(slots)] = True
    hf_mask = np.where(~mask, -10000.0, np.where(is_global, 10000.0, 0.0)).astype(np.float32)
    with torch.no_grad():
        ref = attention(torch.tensor(x), attention_mask=torch.tensor(hf_mask), is_index_masked=torch.tensor(~mask),
                        is_index_global_attn=torch.tensor(is_global),
                        is_global_attn=bool(is_global.any()))[0].numpy()

    config = get_config("bert_tiny", d_model=hidden, num_heads=heads, head_dim=hidden // heads, dropout_rate=0.0,
                        attention_window=window)
    biases, = W.stack_biases(window, 1, 1, W.make_slots(jnp.asarray(mask)), False, jnp.asarray(is_global), 4)
    module = L.MultiHeadAttention(config)
    ours = module.apply({"params": _our_attention_params(attention, hidden, heads)}, jnp.asarray(x), jnp.asarray(x),
                        biases, jnp.broadcast_to(jnp.arange(n), (2, n)))
    assert_close(np.asarray(ours)[mask], ref[mask], RTOL)


def test_convert_from_hf_imports_a_longformer(tmp_path):
    """`t5lite convert --from_hf` of a saved LongformerModel (per-layer windows): the run's config is
    windowed and its last hidden states are Hugging Face's, with global tokens and padding."""
    torch, _ = _hf_longformer_attention(4)
    import transformers

    from t5lite import cli
    from t5lite.infer.checkpoint_reader import restore_params
    from t5lite.interop import hf
    from t5lite.models.config import load_config
    config = transformers.LongformerConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=64, attention_window=[4, 8], max_position_embeddings=66,
                                           type_vocab_size=1, initializer_range=0.2)
    transformers.LongformerModel(config).eval().save_pretrained(tmp_path / "hf")
    cli.main(["convert", "--from_hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")])
    assert load_config(str(tmp_path / "run" / "model_config.json")).attention_window == (4, 8)

    module, variables = hf.load(str(tmp_path / "hf"))
    restored = restore_params(str(tmp_path / "run"), variables["params"])
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), restored,
                 variables["params"])
    ids = np.random.default_rng(0).integers(3, 97, size=(2, 21))
    ids[1, 14:] = config.pad_token_id
    is_global = np.zeros_like(ids)
    is_global[0, [0, 7]] = is_global[1, 0] = 1
    model = transformers.LongformerModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(ids != config.pad_token_id),
                    global_attention_mask=torch.tensor(is_global)).last_hidden_state.numpy()
    ours = module.apply(variables, encoder_input_tokens=jnp.asarray(ids),
                        encoder_global_attention_mask=jnp.asarray(is_global))
    kept = ids != config.pad_token_id
    assert_close(np.asarray(ours)[kept], ref[kept], 5e-5)


def test_decoding_with_the_kv_cache_keeps_the_band():
    """A windowed GPT-2 decoding token by token over its KV cache gives the logits of scoring the whole
    sequence with the blockwise band."""
    from t5lite.models.transformer import init_cache
    config = get_config("gpt2_tiny", dropout_rate=0.0, attention_window=4, attention_dilation=2)
    module = build_module(config)
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 900, size=(2, 12)))
    params = module.init(jax.random.PRNGKey(0), decoder_input_tokens=tokens)["params"]
    scored = np.asarray(module.apply({"params": params}, decoder_input_tokens=tokens))
    cache = init_cache(module, params, 12, batch_size=2)
    step = jax.jit(lambda cache, t: module.apply({"params": params, "cache": cache}, decoder_input_tokens=t,
                                                 decode=True, mutable=["cache"]))
    decoded = []
    for i in range(12):
        logits, state = step(cache, tokens[:, i:i + 1])
        cache = state["cache"]
        decoded.append(np.asarray(logits))
    assert_close(np.concatenate(decoded, axis=1), scored, RTOL)
