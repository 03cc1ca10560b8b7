"""MFU accounting: the FLOP formula against the model's real shapes and XLA's own count; peaks."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models import build, flops, get_config
from t5lite.train import mfu, optimizers
from t5lite.train.partitioning import Partitioner
from t5lite.train.step import TrainTask

ENC_LEN, DEC_LEN = 24, 16
WIDE = dict(d_model=128, d_ff=512, num_heads=4, head_dim=32)  # matmuls dominate the elementwise work


def _features(cfg, batch=2):
    tokens = lambda n: jnp.full((batch, n), 5, jnp.int32)
    return {"encoder": {"encoder_input_tokens": tokens(ENC_LEN)},
            "decoder": {"decoder_input_tokens": tokens(DEC_LEN)},
            "encoder_decoder": {"encoder_input_tokens": tokens(ENC_LEN),
                                "decoder_input_tokens": tokens(DEC_LEN)}}[cfg.arch]


def _count_from_parameter_shapes(cfg, params):
    """MaxText's formula re-derived from the parameter tree: 6 x (each matmul kernel's size x the
    tokens it is applied to) + 12 x layers x q_len x kv_len x heads x head_dim, halved if causal."""
    head_len = ENC_LEN if cfg.arch == "encoder" else DEC_LEN
    macs = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        name = jax.tree_util.keystr(path)
        if "pooler" in name or "sentence_head" in name:  # not on the pre-training path
            continue
        if "token_embedder" in name:  # a lookup; the tied output head multiplies by it
            tied_head = cfg.tie_embeddings and not (cfg.arch == "encoder" and cfg.encoder_head != "mlm")
            macs += leaf.size * head_len if tied_head else 0
            continue
        if not name.endswith("['kernel']"):
            continue
        reads_encoder = name.startswith("['encoder']") or "mlm_head" in name or "discriminator_head" in name \
            or "cross_attention']['key" in name or "cross_attention']['value" in name
        uses = cfg.num_encoder_layers if cfg.share_layers and "['layers']" in name else 1
        macs += leaf.size * (ENC_LEN if reads_encoder else DEC_LEN) * uses
    width = cfg.num_heads * cfg.head_dim
    attention = {"encoder": cfg.num_encoder_layers * ENC_LEN * ENC_LEN,
                 "decoder": cfg.num_decoder_layers * DEC_LEN * DEC_LEN / 2,
                 "encoder_decoder": cfg.num_encoder_layers * ENC_LEN * ENC_LEN
                 + cfg.num_decoder_layers * (DEC_LEN * DEC_LEN / 2 + DEC_LEN * ENC_LEN)}[cfg.arch]
    return 6 * macs + 12 * attention * width


@pytest.mark.parametrize("preset", ["t5_tiny", "t5_1_1_tiny", "bart_tiny", "gpt2_tiny", "bert_tiny", "albert_tiny",
                                    "electra_tiny", "electra_tiny_generator"])
def test_train_flops_match_the_parameter_shapes(preset):
    cfg = get_config(preset)
    model = build(cfg)
    params = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), **_features(cfg))))["params"]
    expected = _count_from_parameter_shapes(cfg, params)
    assert flops.train_flops_per_example(cfg, ENC_LEN, DEC_LEN) == pytest.approx(expected, rel=1e-12)


def _dot_flops(jaxpr) -> float:
    """2 x multiply-adds of every dot_general the program runs (sub-programs included)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs_shape = eqn.invars[0].aval.shape
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs_shape[d] for d in lhs_contract)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    total += _dot_flops(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    total += _dot_flops(sub)
    return total


@pytest.mark.parametrize("preset", ["t5_tiny", "gpt2_tiny", "bert_tiny"])
def test_train_flops_match_what_the_compiled_step_computes(preset):
    """Forward + backward of the real model, counted by the traced program and by XLA's cost
    analysis. Both run the full q x k product under a causal mask, which MaxText's count halves."""
    cfg = get_config(preset, dropout_rate=0.0, **WIDE)
    model, features = build(cfg), _features(cfg)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), **features))["params"]
    grad = jax.grad(lambda p: jnp.sum(model.apply({"params": p}, **features) ** 2))
    batch = next(iter(features.values())).shape[0]
    formula = batch * flops.train_flops_per_example(cfg, ENC_LEN, DEC_LEN)
    causal_half = 3 * 2 * DEC_LEN ** 2 * cfg.num_heads * cfg.head_dim * cfg.num_decoder_layers * batch
    program = _dot_flops(jax.make_jaxpr(grad)(params).jaxpr)
    assert program == pytest.approx(formula + (causal_half if cfg.arch != "encoder" else 0), rel=1e-9)
    xla = jax.jit(grad).lower(params).compile().cost_analysis()["flops"]
    assert xla == pytest.approx(formula, rel=0.06)  # the rest is norms, softmax, GELU, ...


def test_flop_count_names_the_missing_length():
    with pytest.raises(ValueError, match="decoder_length"):
        flops.train_flops_per_example(get_config("gpt2_tiny"), encoder_length=16)


@pytest.mark.parametrize("kind,peak", [
    ("TPU v2", 22.5e12), ("TPU v3", 61.5e12),  # per TensorCore: a JAX device; 45 and 123 per chip
    ("TPU v4", 275e12), ("TPU v5 lite", 197e12), ("TPU v5", 459e12), ("TPU v6 lite", 918e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A100-SXM4-40GB", 312e12), ("NVIDIA H100 80GB HBM3", 989e12)])
def test_peak_comes_from_the_spec_sheet_by_device_kind(kind, peak):
    assert mfu.peak_flops_per_device(device_kind=kind) == (peak, f"{kind} spec sheet, bf16 dense")


def test_peak_is_configured_or_measured_otherwise(monkeypatch):
    assert mfu.peak_flops_per_device(5e12, device_kind="TPU v4") == (5e12, "configured")
    monkeypatch.setattr(mfu, "measured_peak_flops", lambda: 1.5e11)
    assert mfu.peak_flops_per_device(device_kind="cpu") == (1.5e11, "best measured f32 matmul on cpu")
    assert mfu.peak_flops_per_device(device_kind="TPU v4 lite")[1].startswith("best measured")


def test_measured_peak_skips_sizes_over_the_time_budget():
    ran = []

    def matmul(n):
        a = np.ones((n, n), np.float32)
        return lambda: ran.append(n) or a @ a

    peak = mfu.best_matmul_flops(matmul, sizes=(64, 128, 4096), repeats=2, max_seconds=1e-2)
    assert sorted(set(ran)) == [64, 128] and peak > 0  # 4096 would take ~32768x the 128 run


@pytest.mark.parametrize("preset,features", [
    ("bert_tiny", {"encoder_input_tokens": ENC_LEN, "encoder_target_tokens": ENC_LEN, "encoder_loss_weights": ENC_LEN}),
    ("gpt2_tiny", {"decoder_input_tokens": DEC_LEN, "decoder_target_tokens": DEC_LEN, "decoder_loss_weights": DEC_LEN}),
    ("t5_tiny", {"encoder_input_tokens": ENC_LEN, "decoder_input_tokens": DEC_LEN, "decoder_target_tokens": DEC_LEN,
                 "decoder_loss_weights": DEC_LEN})])
def test_train_task_counts_the_lengths_of_its_family(preset, features):
    cfg = get_config(preset)
    schedule = optimizers.constant(1e-3)
    trainer = TrainTask(cfg, optimizers.adafactor(schedule), schedule, Partitioner(), features)
    params = nn.unbox(jax.eval_shape(lambda: build(cfg).init(jax.random.key(0), **_features(cfg))))["params"]
    assert trainer.flops_per_step(4) == pytest.approx(4 * _count_from_parameter_shapes(cfg, params), rel=1e-12)


def _recurrent_macs_from_shapes(params, length):
    """(frozen, trained) MACs of one `length`-word example re-derived from the parameter tree: each
    kernel's size once per word (LSTM gates and projections, highway layers), a char-CNN filter of
    width w at each of a word's 50 character slots, the pooled head's kernels once per example;
    embedding tables are lookups. ELMo's biLM (`bilm`) is the frozen part."""
    frozen = trained = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        name = jax.tree_util.keystr(path)
        if leaf.ndim < 2 or "embed" in name:
            continue
        macs = leaf.size * (1 if "['head']" in name else (50 - leaf.shape[0] + 1) * length if "conv" in name
                             else length)
        if name.startswith("['bilm']"):
            frozen += macs
        else:
            trained += macs
    return frozen, trained


@pytest.mark.parametrize("backbone", ["awd_lstm", "elmo", "static"])
def test_word_classifiers_count_what_runs(backbone, tmp_path):
    """No word softmax; a trained part 3x its forward, ELMo's frozen biLM 1x (hand check on
    awd_lstm_tiny: 4 x 256 x (64 + 256) + 4 x 256 x (256 + 256) + 4 x 64 x (256 + 64) MACs per word)."""
    from flax.core import meta

    from t5lite.data.word_vectors import WordVectors, save_word2vec
    from t5lite.models.awd_lstm import AWDLSTMClassifier
    from t5lite.models.feature_classifier import FrozenELMoClassifier, FrozenStaticClassifier
    from t5lite.objectives.recurrent import RecurrentClassificationObjective
    length, labels, hidden = 12, 3, 20
    tokens = jnp.ones((1, length), jnp.int32)
    vectors = str(tmp_path / "vectors.txt")
    save_word2vec(WordVectors(("a", "b"), np.ones((2, 24), np.float32)), vectors)
    config = get_config("elmo_tiny" if backbone == "elmo" else "awd_lstm_tiny_classifier")
    module, features = {
        "awd_lstm": (AWDLSTMClassifier(config, labels, hidden), {"encoder_input_tokens": tokens}),
        "elmo": (FrozenELMoClassifier(config, labels, "bilstm", hidden),
                 {"encoder_input_tokens": tokens, "encoder_input_chars": jnp.ones((1, 50 * length), jnp.int32)}),
        "static": (FrozenStaticClassifier(config.vocab_size, 24, nn.initializers.zeros, labels, "bilstm", hidden),
                   {"encoder_input_tokens": tokens}),
    }[backbone]
    params = meta.unbox(jax.eval_shape(lambda: module.init(jax.random.key(0), **features)))["params"]
    frozen, trained = _recurrent_macs_from_shapes(params, length)
    objective = RecurrentClassificationObjective(labels, backbone, hidden=hidden,
                                                 word_vectors=vectors if backbone == "static" else None)
    counted = objective.train_flops_per_example(config, {"encoder_input_tokens": length})
    assert counted == pytest.approx(2 * (frozen + 3 * trained), rel=1e-12)
    if backbone == "awd_lstm":
        lstm = 4 * 256 * (64 + 256) + 4 * 256 * (256 + 256) + 4 * 64 * (256 + 64)
        assert counted == pytest.approx(6 * (lstm * length + 3 * 64 * hidden + hidden * labels), rel=1e-12)
