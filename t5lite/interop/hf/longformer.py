"""Longformer (`LongformerModel`, `LongformerForMaskedLM`): RoBERTa's layout (positions past the pad id)
with windowed attention (t5lite.models.windowed_attention) and, in every layer, the global tokens'
own query, key and value projections (`query_global`, `key_global`, `value_global`)."""
from __future__ import annotations

from t5lite.interop.hf.bert import EncoderFamily, EncoderNames
from t5lite.interop.hf.fields import HFConversionError, require
from t5lite.interop.hf.rules import dense
from t5lite.models.config import ModelConfig
from t5lite.models.windowed_attention import per_layer

NAMES = EncoderNames("longformer", "longformer", ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
                     mlm_architecture="LongformerForMaskedLM")
GLOBAL_PROJECTIONS = ("query_global", "key_global", "value_global")


class LongformerFamily(EncoderFamily):
    def __init__(self, names: EncoderNames = NAMES):
        super().__init__(names)

    def from_hf(self, c: dict, tensors) -> ModelConfig:
        if c.get("attention_mode", "longformer") != "longformer":
            raise HFConversionError(f"attention_mode={c['attention_mode']!r} is not supported (only 'longformer')")
        cfg = super().from_hf(c, tensors)
        offset = cfg.pad_token_id + 1
        window = c.get("attention_window", 512)
        windows = tuple(window) if isinstance(window, (list, tuple)) else (window,)
        return cfg.replace(position_offset=offset, max_position_embeddings=cfg.max_position_embeddings - offset,
                           attention_window=windows[0] if len(set(windows)) == 1 else windows)

    def to_hf(self, cfg: ModelConfig) -> dict:
        require(cfg, "longformer", position_offset=cfg.pad_token_id + 1, attention_dilation=1)
        plain = cfg.replace(attention_window=None, position_offset=0,
                            max_position_embeddings=cfg.max_position_embeddings + cfg.position_offset)
        return super().to_hf(plain) | dict(attention_window=list(per_layer(cfg.attention_window,
                                                                            cfg.num_encoder_layers)))

    def rules(self, cfg: ModelConfig):
        p = self.names.prefix
        return super().rules(cfg) + [
            rule for i in range(cfg.num_encoder_layers) for name in GLOBAL_PROJECTIONS
            for rule in dense(f"{p}.encoder.layer.{i}.attention.self.{name}", f"encoder/layers_{i}/self_attention/{name}")]
