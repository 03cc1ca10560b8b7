"""GPT-2 (GPT2LMHeadModel, GPT2Model): Conv1D weights, and q, k, v fused in one c_attn tensor. As the
decoder of an encoder-decoder (t5lite's arch="encoder_decoder"; transformers' add_cross_attention,
vision_encoder_decoder.py) each layer also has a `crossattention` (Conv1D `q_attn`, `c_attn` =
key | value, `c_proj`) and its `ln_cross_attn`."""
from __future__ import annotations

import numpy as np

from t5lite.interop.hf.fields import ACT_TO_HF, HFConversionError, activation_from_hf, require, special_ids
from t5lite.interop.hf.rules import Rule, norm
from t5lite.models.config import ModelConfig


class GPT2Family:
    @staticmethod
    def from_hf(c: dict, tensors: dict[str, np.ndarray]) -> ModelConfig:
        for flag in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
            if c.get(flag):
                raise HFConversionError(f"GPT-2 with {flag}=True is not supported")
        d = c["n_embd"]
        return ModelConfig(
            arch="decoder", vocab_size=c["vocab_size"], d_model=d, num_heads=c["n_head"],
            head_dim=d // c["n_head"], d_ff=c.get("n_inner") or 4 * d, num_encoder_layers=0,
            num_decoder_layers=c["n_layer"],
            mlp_activations=(activation_from_hf(c.get("activation_function", "gelu_new")),),
            dropout_rate=c.get("resid_pdrop", 0.1), mlp_dropout=False, norm="layer", norm_position="pre", final_norm=True,
            use_bias=True, scale_attention=c.get("scale_attn_weights", True),
            layer_norm_epsilon=c.get("layer_norm_epsilon", 1e-5), init_std=0.02, position_encoding="learned",
            max_position_embeddings=c.get("n_positions", 1024), scale_tied_logits=False,
            pad_token_id=c.get("pad_token_id") or 0,
            **special_ids({**c, "decoder_start_token_id": c.get("bos_token_id")}, start=50256, eos=50256))

    @staticmethod
    def to_hf(cfg: ModelConfig) -> dict:
        require(cfg, "GPT-2", arch="decoder", norm="layer", norm_position="pre", final_norm=True,
                 embedding_norm=False, use_bias=True, position_encoding="learned", position_offset=0,
                 embedding_size=None, type_vocab_size=0, tie_embeddings=True, scale_tied_logits=False,
                 logits_bias=False, scale_embeddings=False, share_layers=False)
        if len(cfg.mlp_activations) != 1 or cfg.num_heads * cfg.head_dim != cfg.d_model:
            raise HFConversionError("GPT-2 needs a plain MLP and num_heads * head_dim == d_model")
        return dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], vocab_size=cfg.vocab_size,
                    n_embd=cfg.d_model, n_head=cfg.num_heads, n_layer=cfg.num_decoder_layers, n_inner=cfg.d_ff,
                    n_positions=cfg.max_position_embeddings, activation_function=ACT_TO_HF[cfg.mlp_activations[0]],
                    resid_pdrop=cfg.dropout_rate, embd_pdrop=cfg.dropout_rate, attn_pdrop=cfg.dropout_rate,
                    layer_norm_epsilon=cfg.layer_norm_epsilon, scale_attn_weights=cfg.scale_attention,
                    tie_word_embeddings=True, bos_token_id=cfg.decoder_start_token_id, eos_token_id=cfg.eos_token_id)

    @staticmethod
    def rules(cfg: ModelConfig) -> list[Rule]:
        rules = [Rule("transformer.wte.weight", ("token_embedder/embedding",)),
                 Rule("transformer.wpe.weight", ("decoder/position_embedder/table/embedding",))]
        for i in range(cfg.num_decoder_layers):
            hf, ours = f"transformer.h.{i}", f"decoder/layers_{i}"
            qkv = tuple(f"{ours}/self_attention/{n}" for n in ("query", "key", "value"))
            rules += [Rule(f"{hf}.attn.c_attn.weight", tuple(f"{q}/kernel" for q in qkv), "conv1d"),
                      Rule(f"{hf}.attn.c_attn.bias", tuple(f"{q}/bias" for q in qkv), "vector"),
                      Rule(f"{hf}.attn.c_proj.weight", (f"{ours}/self_attention/out/kernel",), "conv1d", 2),
                      Rule(f"{hf}.attn.c_proj.bias", (f"{ours}/self_attention/out/bias",)),
                      Rule(f"{hf}.mlp.c_fc.weight", (f"{ours}/mlp/wi/kernel",), "conv1d"),
                      Rule(f"{hf}.mlp.c_fc.bias", (f"{ours}/mlp/wi/bias",)),
                      Rule(f"{hf}.mlp.c_proj.weight", (f"{ours}/mlp/wo/kernel",), "conv1d"),
                      Rule(f"{hf}.mlp.c_proj.bias", (f"{ours}/mlp/wo/bias",))]
            rules += norm(f"{hf}.ln_1", f"{ours}/self_attention_norm") + norm(f"{hf}.ln_2", f"{ours}/mlp_norm")
            if cfg.arch == "encoder_decoder":
                rules += _cross_attention(f"{hf}.crossattention", f"{ours}/cross_attention")
                rules += norm(f"{hf}.ln_cross_attn", f"{ours}/cross_attention_norm")
        return rules + norm("transformer.ln_f", "decoder/final_norm")


def _cross_attention(hf: str, ours: str) -> list[Rule]:
    """GPT2Attention with is_cross_attention: the query from the decoder (`q_attn`), key and value
    from the encoder's states fused in `c_attn`."""
    return [Rule(f"{hf}.q_attn.weight", (f"{ours}/query/kernel",), "conv1d"),
            Rule(f"{hf}.q_attn.bias", (f"{ours}/query/bias",), "vector"),
            Rule(f"{hf}.c_attn.weight", (f"{ours}/key/kernel", f"{ours}/value/kernel"), "conv1d"),
            Rule(f"{hf}.c_attn.bias", (f"{ours}/key/bias", f"{ours}/value/bias"), "vector"),
            Rule(f"{hf}.c_proj.weight", (f"{ours}/out/kernel",), "conv1d", 2),
            Rule(f"{hf}.c_proj.bias", (f"{ours}/out/bias",))]
