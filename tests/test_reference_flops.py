"""t5lite's FLOP count of a decoder-only model against MaxText's own formula.

`maxtext_training_flops` transcribes MaxText's `calculate_tflops_training_per_device` and
`calculate_ffn_mamtul_tflops_per_device` (AI-Hypercomputer/maxtext, MaxText/maxtext_utils.py),
the dense, non-MLA, non-MoE branch (`decoder_block` default, `attention_type` not "mla",
`num_experts` = 1, `gradient_accumulation_steps` = 1, no DPO, no vision encoder), returned in
FLOPs instead of TFLOPs. MaxText counts decoder-only models only; the encoder and cross-attention
terms of t5lite's encoder-decoder count are t5lite's (flops.py says so).
"""
import types

import pytest

from t5lite.models import flops, get_config


def _ffn_matmul_flops(config, mlp_dim):
    # MaxText/maxtext_utils.py, calculate_ffn_mamtul_tflops_per_device
    ffn1_flops = (
        2 * config.per_device_batch_size * config.max_target_length * mlp_dim * config.emb_dim * len(config.mlp_activations)
    )
    ffn2_flops = 2 * config.per_device_batch_size * config.max_target_length * mlp_dim * config.emb_dim
    return ffn1_flops + ffn2_flops


def maxtext_training_flops(config):
    """MaxText/maxtext_utils.py, calculate_tflops_training_per_device (dense branch), x 10**12."""
    total_ffn_flops = _ffn_matmul_flops(config, config.mlp_dim)
    qkv_flops = (
        2
        * config.per_device_batch_size
        * config.max_target_length
        * config.emb_dim
        * (config.num_query_heads + 2 * config.num_kv_heads)
        * config.head_dim
    )
    noncausal_attention_flops = (
        4 * config.per_device_batch_size * config.max_target_length**2 * config.num_query_heads * config.head_dim
    )
    projection_flops = (
        2 * config.per_device_batch_size * config.max_target_length * config.emb_dim * config.num_query_heads
        * config.head_dim
    )
    # Divide attention flops by 2 due to causal mask
    causal_attention_flops = noncausal_attention_flops / 2
    embedding_flops = 2 * config.per_device_batch_size * config.max_target_length * config.emb_dim * config.vocab_size
    # multiply by 3 for both feed forward and back propagation flops
    learnable_weight_flops = ((total_ffn_flops + qkv_flops + projection_flops) * config.num_decoder_layers
                              + embedding_flops) * 3
    attention_flops = causal_attention_flops * config.num_decoder_layers * 3
    return learnable_weight_flops + attention_flops


def _maxtext_config(cfg, length, batch):
    """MaxText's config fields for a t5lite decoder-only config (multi-head attention: kv heads = heads)."""
    return types.SimpleNamespace(
        per_device_batch_size=batch, max_target_length=length, emb_dim=cfg.d_model, mlp_dim=cfg.d_ff,
        mlp_activations=cfg.mlp_activations, num_query_heads=cfg.num_heads, num_kv_heads=cfg.num_heads,
        head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, num_decoder_layers=cfg.num_decoder_layers)


@pytest.mark.parametrize("preset", ["gpt2_tiny", "gpt2_small", "gpt2_medium", "gpt2_large", "gpt2_xl"])
@pytest.mark.parametrize("length", [64, 1024])
def test_gpt2_training_flops_equal_maxtexts(preset, length):
    cfg = get_config(preset)
    batch = 8
    expected = maxtext_training_flops(_maxtext_config(cfg, length, batch))
    assert batch * flops.train_flops_per_example(cfg, decoder_length=length) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("overrides", [dict(mlp_activations=("gelu", "linear")),        # gated MLP (T5 v1.1, Llama)
                                       dict(head_dim=32, num_heads=6, d_model=128),      # heads x head_dim != d_model
                                       dict(prefix_lm=True)])                            # counted as causal
def test_decoder_variants_equal_maxtexts(overrides):
    cfg = get_config("gpt2_tiny", **overrides)
    expected = maxtext_training_flops(_maxtext_config(cfg, 48, 1))
    assert flops.train_flops_per_example(cfg, decoder_length=48) == pytest.approx(expected, rel=1e-12)
