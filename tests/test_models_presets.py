"""Presets: parameter counts (jax.eval_shape, no real init) equal the Hugging Face models' and the
published sizes; every parameter has logical axis names; `build` dispatches on `arch`; looped and
scanned layers give the same param tree up to the layers axis."""
import flax
import gin
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import models
from t5lite.errors import ConfigError
from t5lite.models import get_config, vision

# Exact counts, checked against transformers' own classes (meta device) when these were written:
# BertForPreTraining, RobertaForMaskedLM, AlbertForPreTraining, ElectraForPreTraining,
# GPT2LMHeadModel, BartForConditionalGeneration (+ 50,265 for final_logits_bias, a buffer in HF),
# T5ForConditionalGeneration. Published sizes are the papers' / model cards' rounded numbers.
PARAM_COUNTS = {
    # preset: (exact, published, relative tolerance of the published number)
    "bert_base": (110_106_428, 110e6, 0.01),
    "bert_large": (336_226_108, 340e6, 0.02),
    "roberta_base": (124_697_433, 125e6, 0.01),
    "albert_base": (11_813_810, 12e6, 0.02),
    "electra_small": (13_549_057, 14e6, 0.04),
    "gpt2_small": (124_439_808, 124e6, 0.01),
    "bart_base": (139_470_681, 139e6, 0.01),
    "t5_small": (60_506_624, 60.5e6, 0.001),
    "t5_base": (222_903_552, 222.9e6, 0.001),
    "t5_1_1_small": (76_961_152, 77e6, 0.01),
    # HF T5ForConditionalGeneration from google/t5-v1_1-xl / -xxl config.json values (meta device):
    # its unique parameters plus the untied lm_head (32128 x d_model), which transformers 5's
    # parameters() folds into the shared embedding; published as "3B" and "11B".
    "t5_1_1_xl": (2_849_757_184, 3e9, 0.06),
    "t5_1_1_xxl": (11_135_332_352, 11e9, 0.02),
    "gpt2_medium": (354_823_168, 355e6, 0.01),
    "roberta_large": (355_412_057, 355e6, 0.01),
    "bart_large": (406_341_721, 406e6, 0.01),
    "electra_base": (109_483_009, 110e6, 0.01),
    "deberta_v3_base": (184_551_780, 184e6, 0.01),   # DebertaV2ForMaskedLM; the model card says 86M + 98M embeddings
}
FEATURES = dict(encoder_input_tokens=jnp.zeros((1, 8), jnp.int32), decoder_input_tokens=jnp.zeros((1, 8), jnp.int32))
KNOWN_AXES = {"embed", "mlp", "heads", "kv", "vocab", "layers", "relpos_buckets", "abspos_buckets", "token_types",
              "factorized_embed", "classes", "patch_rows", "patch_cols", "channels"}
TINY = sorted(n for n in models.PRESETS if n.endswith("_tiny") or n.endswith("_tiny_generator"))


def abstract_params(config):
    module = models.build(config)
    return jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), **FEATURES, **vision.init_features(config)))[
        "params"]


def count(params):
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


@pytest.mark.parametrize("name", sorted(PARAM_COUNTS))
def test_param_counts(name):
    exact, published, tol = PARAM_COUNTS[name]
    n = count(abstract_params(models.get_config(name)))
    assert n == exact
    assert abs(n - published) / published < tol


@pytest.mark.parametrize("name", TINY + ["bert_base", "gpt2_small", "bart_base", "albert_base"])
def test_every_param_has_logical_axes(name):
    params = abstract_params(models.get_config(name))
    flat = flax.traverse_util.flatten_dict(params, is_leaf=lambda _, x: isinstance(x, nn.LogicallyPartitioned))
    for path, leaf in flat.items():
        assert isinstance(leaf, nn.LogicallyPartitioned), "/".join(path)
        assert len(leaf.names) == len(leaf.value.shape) and len(set(leaf.names)) == len(leaf.names), path
        assert not set(leaf.names) - KNOWN_AXES, (path, leaf.names)


@pytest.mark.parametrize("name", ["t5_tiny", "bert_tiny", "albert_tiny", "gpt2_tiny", "bart_tiny"])
def test_scanned_tree_equals_looped_up_to_layers_axis(name):
    cfg = models.get_config(name)
    looped = nn.meta.unbox(abstract_params(cfg))
    scanned = nn.meta.unbox(abstract_params(cfg.replace(scan_layers=True)))
    as_shapes = lambda tree: jax.tree.map(lambda x: x.shape, tree)
    if cfg.share_layers:   # ALBERT: one shared layer either way
        assert as_shapes(looped) == as_shapes(scanned)
    else:
        zeros = lambda tree: jax.tree.map(lambda s: np.zeros(s.shape, np.float32), tree)
        assert as_shapes(models.unscan_params(zeros(scanned))) == as_shapes(looped)
        assert as_shapes(models.scan_params(zeros(looped))) == as_shapes(scanned)
    boxed = abstract_params(cfg.replace(scan_layers=True))
    layer_leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    if not cfg.share_layers:
        assert any(leaf.names[0] == "layers" for leaf in layer_leaves)


@pytest.mark.parametrize("name, cls", [("bert_tiny", models.Encoder), ("deberta_v3_tiny", models.Encoder),
                                       ("gpt2_tiny", models.Decoder),
                                       ("t5_tiny", models.EncoderDecoder), ("bart_tiny", models.EncoderDecoder)])
def test_build_dispatches_on_arch(name, cls):
    assert isinstance(models.build(name), cls)
    assert isinstance(models.build(models.get_config(name)), cls)


def test_unknown_preset_and_bad_fields():
    with pytest.raises(KeyError, match="Did you mean"):
        models.get_config("bert_bsae")
    with pytest.raises(ValueError, match="position_encoding"):
        models.get_config("bert_tiny", position_encoding="alibi")
    with pytest.raises(ValueError, match="sentence_head"):
        models.get_config("roberta_tiny", sentence_head=True)


def test_outputs_per_family_are_float32_with_the_documented_shapes():
    rng = np.random.RandomState(0)
    for name, want in [("bert_tiny", (2, 8, 1000)), ("electra_tiny", (2, 8)), ("gpt2_tiny", (2, 8, 1000)),
                       ("bart_tiny", (2, 8, 1000)), ("t5_tiny", (2, 8, 2176))]:
        cfg = models.get_config(name, dtype="bfloat16")
        module = models.build(cfg)
        shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), **FEATURES))
        variables = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.05, s.shape), s.dtype), shapes)
        tokens = jnp.asarray(rng.randint(3, 900, (2, 8)))
        logits = jax.eval_shape(lambda v: module.apply(v, encoder_input_tokens=tokens, decoder_input_tokens=tokens),
                                variables)
        assert logits.shape == want and logits.dtype == jnp.float32, name
        hidden = jax.eval_shape(lambda v: module.apply(v, encoder_input_tokens=tokens, decoder_input_tokens=tokens,
                                                       method="encode"), variables)
        assert hidden.shape == (2, 8, cfg.d_model), name


def test_gin_overrides_change_any_field_and_name_a_misspelt_one(clean_gin_state):
    from t5lite.train.trainer import model_config
    gin.parse_config(["model_config.preset = 'bert_tiny'",
                      "model_config.overrides = {'num_encoder_layers': 1, 'd_ff': 96}"])
    config = model_config()
    assert (config.num_encoder_layers, config.d_ff) == (1, 96)
    assert config.d_model == get_config("bert_tiny").d_model
    gin.parse_config(["model_config.overrides = {'num_encoder_layer': 1}"])
    with pytest.raises(ConfigError, match="did you mean num_encoder_layers"):
        model_config()


def _hf_mlp_has_hidden_dropout(family: str) -> bool:
    """Whether Hugging Face's module drops the MLP's hidden units (between its two dense layers)."""
    import torch
    import transformers as T
    dropouts = lambda module: any(isinstance(m, torch.nn.Dropout) for m in module.modules())
    if family == "bert":    # BertIntermediate is dense + activation; BertOutput's dropout is the residual one
        return dropouts(T.models.bert.modeling_bert.BertIntermediate(T.BertConfig()))
    if family == "t5":      # T5DenseActDense: wi, activation, dropout, wo
        return dropouts(T.models.t5.modeling_t5.T5DenseActDense(T.T5Config()))
    if family == "gpt2":    # GPT2MLP: c_fc, activation, c_proj, then its one dropout (the residual one)
        mlp = T.models.gpt2.modeling_gpt2.GPT2MLP(3072, T.GPT2Config())
        return [m for m in mlp.modules() if isinstance(m, torch.nn.Dropout)] != [mlp.dropout]
    return T.BartConfig().activation_dropout > 0   # BART: fc1, activation, activation_dropout, fc2


@pytest.mark.parametrize("name, family", [("bert_tiny", "bert"), ("minilm_l6_h384", "bert"), ("gpt2_small", "gpt2"),
                                          ("bart_base", "bart"), ("t5_small", "t5")])
def test_mlp_dropout_only_where_the_family_has_it(name, family):
    """In training, a family whose Hugging Face MLP has no dropout on its hidden units gives the
    deterministic MLP output; T5's drops them."""
    pytest.importorskip("transformers", reason="Hugging Face's modules are the reference")
    from t5lite.models.layers import MlpBlock
    has_dropout = _hf_mlp_has_hidden_dropout(family)
    config = models.get_config(name, dropout_rate=0.5)
    x = jax.random.normal(jax.random.key(0), (2, 5, config.d_model))
    params = MlpBlock(config).init(jax.random.key(1), x)
    train = MlpBlock(config, deterministic=False).apply(params, x, rngs={"dropout": jax.random.key(2)})
    assert np.allclose(train, MlpBlock(config).apply(params, x)) == (not has_dropout)
