"""The Vision Transformer (`ViTModel`, `ViTForImageClassification`): t5lite's pre-norm encoder on
patches (t5lite.models.vision). Hugging Face keeps the patch projection as a Conv2d, the [CLS]
vector and the position table with leading batch axes of 1, and each layer's norms as
`layernorm_before` (attention) and `layernorm_after` (MLP)."""
from __future__ import annotations

import numpy as np

from t5lite.interop.hf.fields import ACT_TO_HF, HFConversionError, activation_from_hf, require
from t5lite.interop.hf.rules import Rule, attention, dense, mlp, norm
from t5lite.models.config import ModelConfig, get_config

PREFIX = "vit"


def _square(c: dict, field: str) -> int:
    """An image or patch size: an int, or a [height, width] pair of equal sides."""
    value = c.get(field, {"image_size": 224, "patch_size": 16}[field])
    sides = set(value) if isinstance(value, (list, tuple)) else {value}
    if len(sides) != 1:
        raise HFConversionError(f"{field}={value}: t5lite's ViT reads square images and patches")
    return int(sides.pop())


class ViTFamily:
    def from_hf(self, c: dict, tensors: dict[str, np.ndarray]) -> ModelConfig:
        hidden = c["hidden_size"]
        if not c.get("qkv_bias", True):
            raise HFConversionError("qkv_bias=False is not supported (t5lite's ViT has biases on every dense layer)")
        if c.get("pooler_act", "tanh") != "tanh" or c.get("pooler_output_size", hidden) != hidden:
            raise HFConversionError("a pooler other than tanh(dense(hidden_size -> hidden_size)) is not supported")
        image_size, patch_size = _square(c, "image_size"), _square(c, "patch_size")
        names = set(tensors) | {k.split(".", 1)[1] for k in tensors if "." in k}
        return get_config(
            "vit_b16", d_model=hidden, num_heads=c["num_attention_heads"], head_dim=hidden // c["num_attention_heads"],
            d_ff=c["intermediate_size"], num_encoder_layers=c["num_hidden_layers"],
            mlp_activations=(activation_from_hf(c.get("hidden_act", "gelu")),),
            dropout_rate=c.get("hidden_dropout_prob", 0.0), layer_norm_epsilon=c.get("layer_norm_eps", 1e-12),
            init_std=c.get("initializer_range", 0.02), image_size=image_size, patch_size=patch_size,
            num_channels=c.get("num_channels", 3), max_position_embeddings=(image_size // patch_size) ** 2 + 1,
            pooler="pooler.dense.weight" in names)

    def to_hf(self, cfg: ModelConfig) -> dict:
        require(cfg, "vit", arch="encoder", norm="layer", norm_position="pre", final_norm=True, embedding_norm=False,
                use_bias=True, scale_attention=True, position_encoding="learned", position_offset=0,
                type_vocab_size=0, embedding_size=None, encoder_head="none", image_pooling="cls",
                max_position_embeddings=cfg.image_positions)
        if len(cfg.mlp_activations) != 1 or cfg.num_heads * cfg.head_dim != cfg.d_model:
            raise HFConversionError("vit needs one MLP activation and num_heads * head_dim == d_model")
        return dict(model_type="vit", architectures=["ViTModel"], hidden_size=cfg.d_model,
                    num_hidden_layers=cfg.num_encoder_layers, num_attention_heads=cfg.num_heads,
                    intermediate_size=cfg.d_ff, hidden_act=ACT_TO_HF[cfg.mlp_activations[0]],
                    hidden_dropout_prob=cfg.dropout_rate, attention_probs_dropout_prob=cfg.dropout_rate,
                    layer_norm_eps=cfg.layer_norm_epsilon, initializer_range=cfg.init_std, image_size=cfg.image_size,
                    patch_size=cfg.patch_size, num_channels=cfg.num_channels, qkv_bias=True)

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        p = PREFIX
        rules = [Rule(f"{p}.embeddings.cls_token", ("encoder/patch_embedder/cls",), "row", in_ndim=2),
                 Rule(f"{p}.embeddings.position_embeddings", ("encoder/position_embedder/table/embedding",), "row"),
                 Rule(f"{p}.embeddings.patch_embeddings.projection.weight",
                      ("encoder/patch_embedder/projection/kernel",), "conv2d"),
                 Rule(f"{p}.embeddings.patch_embeddings.projection.bias", ("encoder/patch_embedder/projection/bias",))]
        for i in range(cfg.num_encoder_layers):
            hf, ours = f"{p}.encoder.layer.{i}", f"encoder/layers_{i}"
            rules += attention(f"{hf}.attention", f"{ours}/self_attention",
                               ("attention.query", "attention.key", "attention.value", "output.dense"))
            rules += norm(f"{hf}.layernorm_before", f"{ours}/self_attention_norm")
            rules += mlp(f"{hf}.intermediate.dense", f"{hf}.output.dense", f"{ours}/mlp", cfg)
            rules += norm(f"{hf}.layernorm_after", f"{ours}/mlp_norm")
        rules += norm(f"{p}.layernorm", "encoder/final_norm")
        if cfg.pooler:
            rules += dense(f"{p}.pooler.dense", "pooler/dense")
        return rules
