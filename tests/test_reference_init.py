"""Initial parameters against the initialisers of T5X and of Hugging Face.

T5 presets (`init_std=None`): each parameter against the flax initialiser T5X's network gives it
(google-research/t5x, t5x/examples/t5/network.py `Transformer`, `Encoder`, `Decoder` and
t5x/examples/t5/layers.py `MultiHeadDotProductAttention`, `MlpBlock`, `DenseGeneral`, `LayerNorm`),
drawn by flax in the test at T5X's kernel shape. Hugging Face-style presets (`init_std=0.02`):
each parameter against the same parameter of the transformers model built from the exported
config, so initialised by transformers' own `_init_weights` (e.g. `BertPreTrainedModel`,
`GPT2PreTrainedModel`, `BartPreTrainedModel`), read back through t5lite's importer.
Samples are compared by mean and std (6 standard errors of the sample size), by how far they
reach (uniform, 2-sigma truncated normal or normal) and by their all-zero rows.
"""
import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from t5lite.models import build, get_config


def _init_params(cfg):
    tokens = jnp.ones((1, 8), jnp.int32)
    inputs = {"encoder": dict(encoder_input_tokens=tokens), "decoder": dict(decoder_input_tokens=tokens),
              "encoder_decoder": dict(encoder_input_tokens=tokens, decoder_input_tokens=tokens)}[cfg.arch]
    params = nn.unbox(build(cfg).init(jax.random.key(0), **inputs))["params"]
    return {"/".join(k): np.asarray(v) for k, v in flatten_dict(params).items()}


def _reach(x):
    """How far a sample reaches in its own stds: a uniform's sqrt(3) (1.73), a 2-sigma truncated normal's
    2 / 0.8796 (2.27, a sample's own std a little off), or beyond (a normal; told apart from a truncated one only with 2000+ values)."""
    r = np.abs(x).max() / x.std()
    if r <= 1.9:
        return "uniform"
    return "truncated" if r <= 2.4 and x.size >= 2000 else "normal"


def assert_same_distribution(ours, theirs, where):
    assert ours.shape == theirs.shape, where
    if theirs.std() == 0:   # a constant: zeros (biases) or ones (norm scales)
        np.testing.assert_array_equal(ours, theirs, err_msg=where)
        return
    if ours.ndim == 2:
        assert np.flatnonzero(~ours.any(1)).tolist() == np.flatnonzero(~theirs.any(1)).tolist(), f"{where}: zero rows"
    ours, theirs = ours.ravel(), theirs.ravel()
    se = theirs.std() * (2 / ours.size) ** 0.5   # of a mean difference; a std's is smaller
    assert abs(ours.std() - theirs.std()) <= 6 * se, (where, ours.std(), theirs.std())
    assert abs(ours.mean() - theirs.mean()) <= 6 * se, (where, ours.mean(), theirs.mean())
    assert _reach(ours) == _reach(theirs), (where, _reach(ours), _reach(theirs))


# --- T5X -------------------------------------------------------------------------------------

def t5x_initialiser(path, cfg):
    """(flax initialiser, T5X's parameter shape) T5X's T5 gives the parameter t5lite calls `path`."""
    d, h, hd, ff = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff
    # layers.py MultiHeadDotProductAttention.kernel_init, DenseGeneral / MlpBlock.kernel_init
    attention_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'normal')
    dense_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal')
    depth_scaling = jnp.sqrt(hd)
    query_init = lambda *args: attention_init(*args) / depth_scaling
    table = {
        r"token_embedder/embedding": (nn.initializers.normal(stddev=1.0), (cfg.vocab_size, d)),   # network.py
        r".*/query/kernel": (query_init, (d, h * hd)),        # projection kernel_param_shape (embed, joined_kv)
        r".*/(key|value)/kernel": (attention_init, (d, h * hd)),
        r".*/out/kernel": (attention_init, (h * hd, d)),
        r".*/mlp/wi(_\d)?/kernel": (dense_init, (d, ff)),
        r".*/mlp/wo/kernel": (dense_init, (ff, d)),
        r"lm_head/logits_dense/kernel": (dense_init, (d, cfg.vocab_size)),
        # network.py RelativePositionBiases(embedding_init=...), param (num_heads, num_buckets)
        r".*/relpos_bias/rel_embedding": (nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform'),
                                          (h, cfg.relative_attention_num_buckets)),
        r".*norm/scale": (nn.initializers.ones, (d,)),        # layers.py LayerNorm scale_init
    }
    matches = [v for pattern, v in table.items() if re.fullmatch(pattern, path)]
    assert len(matches) == 1, path
    return matches[0]


@pytest.mark.parametrize("preset", ["t5_tiny", "t5_1_1_tiny"])
def test_t5_init_equals_t5xs(preset):
    cfg = get_config(preset)
    for i, (path, ours) in enumerate(sorted(_init_params(cfg).items())):
        init, shape = t5x_initialiser(path, cfg)
        theirs = np.asarray(init(jax.random.key(100 + i), shape, jnp.float32))
        if path.endswith("rel_embedding"):
            theirs = theirs.T   # t5lite keeps [buckets, heads]
        assert_same_distribution(ours, theirs.reshape(ours.shape), f"{preset} {path}")


# --- Hugging Face ------------------------------------------------------------------------------

@functools.cache
def _hugging_face_init(preset, tmp_root):
    """Parameters of the transformers model for `preset`'s exported config, as built by
    transformers (its `_init_weights`), in t5lite's tree."""
    torch = pytest.importorskip("torch", reason="Hugging Face's _init_weights runs on torch (extras 'hf')")
    transformers = pytest.importorskip("transformers", reason="Hugging Face's _init_weights is the reference")
    from t5lite.interop import hf

    hf_config = hf.export_config(get_config(preset))
    torch.manual_seed(0)
    model = getattr(transformers, hf_config["architectures"][0])(transformers.AutoConfig.for_model(**hf_config))
    out = f"{tmp_root}/{preset}"
    model.save_pretrained(out)
    _, variables = hf.load(out)
    return {"/".join(k): np.array(v) for k, v in flatten_dict(variables["params"]).items()}


HF_PRESETS = ["bert_tiny", "gpt2_tiny"] + [pytest.param(p, marks=pytest.mark.slow) for p in
                                           ("roberta_tiny", "albert_tiny", "electra_tiny", "deberta_v3_tiny", "bart_tiny")]


@pytest.mark.parametrize("preset", HF_PRESETS)
def test_hugging_face_style_init_equals_transformers(preset, tmp_path_factory):
    theirs = _hugging_face_init(preset, str(tmp_path_factory.getbasetemp()))
    ours = _init_params(get_config(preset))
    assert ours.keys() == theirs.keys()
    for path in sorted(ours):
        if preset == "roberta_tiny" and path.endswith("position_embedder/table/embedding"):
            # RoBERTa's padding_idx row of the position table (row 1) is zero in transformers; positions
            # start at 2, so t5lite never reads rows 0 and 1 and leaves them random.
            theirs[path] = np.concatenate([theirs[path][:1], ours[path][1:2], theirs[path][2:]])
        assert_same_distribution(ours[path], theirs[path], f"{preset} {path}")
