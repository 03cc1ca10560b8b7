"""BART (BartForConditionalGeneration): post-norm, learned positions offset by 2, a logits bias."""
from __future__ import annotations

import numpy as np

from t5lite.interop.hf.fields import ACT_TO_HF, HFConversionError, activation_from_hf, require, special_ids
from t5lite.interop.hf.rules import Rule, attention, mlp, norm
from t5lite.models.config import ModelConfig


class BartFamily:
    @staticmethod
    def from_hf(c: dict, tensors: dict[str, np.ndarray]) -> ModelConfig:
        if c["encoder_attention_heads"] != c["decoder_attention_heads"] or \
                c["encoder_ffn_dim"] != c["decoder_ffn_dim"]:
            raise HFConversionError("BART with different encoder and decoder widths is not supported")
        if c.get("normalize_before") or c.get("add_final_layer_norm"):
            raise HFConversionError("pre-norm BART (mBART layout) is not supported")
        d = c["d_model"]
        return ModelConfig(
            arch="encoder_decoder", vocab_size=c["vocab_size"], d_model=d, num_heads=c["encoder_attention_heads"],
            head_dim=d // c["encoder_attention_heads"], d_ff=c["encoder_ffn_dim"],
            num_encoder_layers=c["encoder_layers"], num_decoder_layers=c["decoder_layers"],
            mlp_activations=(activation_from_hf(c.get("activation_function", "gelu")),),
            dropout_rate=c.get("dropout", 0.1), mlp_dropout=bool(c.get("activation_dropout", 0.0)),
            norm="layer", norm_position="post", final_norm=False, embedding_norm=True, use_bias=True,
            scale_attention=True, layer_norm_epsilon=1e-5, init_std=0.02, pad_token_id=c.get("pad_token_id", 1),
            scale_embeddings=bool(c.get("scale_embedding", False)), position_encoding="learned",
            max_position_embeddings=c.get("max_position_embeddings", 1024), position_offset=2,
            scale_tied_logits=False, logits_bias=True, **special_ids(c, start=2, eos=2))

    @staticmethod
    def to_hf(cfg: ModelConfig) -> dict:
        require(cfg, "BART", arch="encoder_decoder", norm="layer", norm_position="post", final_norm=False,
                 embedding_norm=True, use_bias=True, scale_attention=True, position_encoding="learned",
                 position_offset=2, embedding_size=None, type_vocab_size=0, tie_embeddings=True,
                 scale_tied_logits=False, logits_bias=True, share_layers=False, layer_norm_epsilon=1e-5)
        return dict(model_type="bart", architectures=["BartForConditionalGeneration"], vocab_size=cfg.vocab_size,
                    d_model=cfg.d_model, encoder_layers=cfg.num_encoder_layers,
                    decoder_layers=cfg.num_decoder_layers, encoder_attention_heads=cfg.num_heads,
                    decoder_attention_heads=cfg.num_heads, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
                    activation_function=ACT_TO_HF[cfg.mlp_activations[0]], dropout=cfg.dropout_rate,
                    attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=cfg.max_position_embeddings,
                    scale_embedding=cfg.scale_embeddings, pad_token_id=cfg.pad_token_id, bos_token_id=0,
                    eos_token_id=cfg.eos_token_id, decoder_start_token_id=cfg.decoder_start_token_id,
                    forced_eos_token_id=cfg.eos_token_id, is_encoder_decoder=True,
                    tie_word_embeddings=True)

    @staticmethod
    def rules(cfg: ModelConfig) -> list[Rule]:
        rules = [Rule("model.shared.weight", ("token_embedder/embedding",)),
                 Rule("final_logits_bias", ("lm_head/logits_bias",), "row")]
        attn_names = ("q_proj", "k_proj", "v_proj", "out_proj")
        for stack, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
            rules.append(Rule(f"model.{stack}.embed_positions.weight", (f"{stack}/position_embedder/table/embedding",)))
            rules += norm(f"model.{stack}.layernorm_embedding", f"{stack}/embedding_norm")
            for i in range(n):
                hf, ours = f"model.{stack}.layers.{i}", f"{stack}/layers_{i}"
                rules += attention(f"{hf}.self_attn", f"{ours}/self_attention", attn_names)
                rules += norm(f"{hf}.self_attn_layer_norm", f"{ours}/self_attention_norm")
                if stack == "decoder":
                    rules += attention(f"{hf}.encoder_attn", f"{ours}/cross_attention", attn_names)
                    rules += norm(f"{hf}.encoder_attn_layer_norm", f"{ours}/cross_attention_norm")
                rules += mlp(f"{hf}.fc1", f"{hf}.fc2", f"{ours}/mlp", cfg)
                rules += norm(f"{hf}.final_layer_norm", f"{ours}/mlp_norm")
        return rules
