"""DeBERTa-v2/v3: the BERT family's layout with disentangled relative attention in place of learned
positions. Only v3-style configs (shared position keys, c2p|p2c, log buckets) are supported."""
from __future__ import annotations

import dataclasses

import numpy as np

from t5lite.interop.hf.bert import MEMBERS, EncoderFamily, EncoderNames
from t5lite.interop.hf.fields import HFConversionError
from t5lite.interop.hf.rules import Rule, norm
from t5lite.models.config import ModelConfig

NAMES = EncoderNames("deberta-v2", "deberta", ("lm_predictions.lm_head.dense", "lm_predictions.lm_head.LayerNorm",
                                               "lm_predictions.lm_head.bias"),
                     mlm_architecture="DebertaV2ForMaskedLM",
                     attention=("self.query_proj", "self.key_proj", "self.value_proj", "output.dense"))
# transformers' DebertaV2 `legacy=True` MLM head uses BERT's names.
LEGACY_MLM = MEMBERS["bert"].mlm
V3_FIELDS = dict(relative_attention=True, position_biased_input=False, share_att_key=True, norm_rel_ebd="layer_norm",
                 conv_kernel_size=0)


class DebertaV2Family(EncoderFamily):
    position_encoding = "disentangled"
    model_name = "DebertaV2"

    def __init__(self, names: EncoderNames = NAMES):
        super().__init__(names)

    def check(self, c: dict, tensors: dict[str, np.ndarray]) -> None:
        """Refuses what is not DeBERTa-v3-like; a legacy MLM head switches to its names."""
        super().check(c, tensors)
        got = {k: c.get(k, 0 if k == "conv_kernel_size" else None) for k in V3_FIELDS}
        pos_att = c.get("pos_att_type") or []
        pos_att = pos_att.split("|") if isinstance(pos_att, str) else pos_att
        if got != V3_FIELDS or sorted(pos_att) != ["c2p", "p2c"] or (c.get("position_buckets") or 0) <= 0 or \
                c.get("embedding_size", c["hidden_size"]) != c["hidden_size"]:
            raise HFConversionError(f"only DeBERTa-v3-style configs are supported ({V3_FIELDS}, pos_att_type "
                                    f"c2p|p2c, position_buckets > 0, embedding_size == hidden_size); got {got}, "
                                    f"pos_att_type={pos_att}")
        if LEGACY_MLM[2] in tensors:
            self.names = dataclasses.replace(self.names, mlm=LEGACY_MLM)

    def from_hf(self, c: dict, tensors: dict[str, np.ndarray]) -> ModelConfig:
        """DebertaV2Model has no pooler: a sequence classifier's top-level `pooler.dense` (its
        ContextPooler) is part of the head, which `hf.load_classifier` reads."""
        return super().from_hf(c, tensors).replace(pooler=False)

    def positions(self, c: dict) -> dict:
        max_relative = c.get("max_relative_positions", -1)
        return dict(position_encoding="disentangled", relative_attention_num_buckets=c["position_buckets"],
                    relative_attention_max_distance=max_relative if max_relative > 0 else
                    c.get("max_position_embeddings", 512))

    def extra_hf_fields(self, cfg: ModelConfig) -> dict:
        """The v3 MLM head multiplies by the word embeddings itself and has no output matrix to tie:
        transformers 4.x would tie its dense layer to the embeddings under tie_word_embeddings (a model
        that cannot load), 5.x ties nothing either way."""
        return dict(V3_FIELDS, pos_att_type=["p2c", "c2p"], legacy=False, tie_word_embeddings=False,
                    position_buckets=cfg.relative_attention_num_buckets,
                    max_relative_positions=cfg.relative_attention_max_distance)

    def position_rules(self, cfg: ModelConfig) -> list[Rule]:
        prefix = self.names.prefix
        return [Rule(f"{prefix}.encoder.rel_embeddings.weight", ("encoder/rel_embedding",)),
                *norm(f"{prefix}.encoder.LayerNorm", "encoder/rel_embedding_norm")]
