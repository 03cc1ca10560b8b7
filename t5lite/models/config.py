"""Model configuration: one frozen dataclass for every family, and the named presets.

A preset is a value; gin or code derives variants with `dataclasses.replace`, never by copying.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Callable

ARCHITECTURES = ("encoder", "decoder", "encoder_decoder")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    arch: str = "encoder_decoder"
    vocab_size: int = 32128
    d_model: int = 512
    num_heads: int = 8
    head_dim: int = 64
    d_ff: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    # ("relu",) is a plain MLP; ("gelu", "linear") is T5 v1.1's gated GELU.
    mlp_activations: tuple[str, ...] = ("relu",)
    dropout_rate: float = 0.1
    # Tied logits reuse the input embedding (scaled by d_model**-0.5 as in T5).
    tie_embeddings: bool = True
    position_encoding: str = "t5_relative"
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    # Activation dtype; params stay float32. "bfloat16" on TPU.
    dtype: str = "float32"
    scan_layers: bool = False
    # "none", "full" (recompute everything) or "minimal" (save matmul outputs).
    remat_policy: str = "none"

    def __post_init__(self):
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch={self.arch!r}: expected one of {ARCHITECTURES}")
        if self.remat_policy not in ("none", "full", "minimal"):
            raise ValueError(f"remat_policy={self.remat_policy!r}: expected 'none', 'full' or 'minimal'")

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


_T5_V1_1 = dict(mlp_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0)
_TINY = dict(vocab_size=2176, d_model=128, num_heads=4, head_dim=32, d_ff=512, num_encoder_layers=2,
             num_decoder_layers=2)

PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "t5_small": lambda: ModelConfig(),
    "t5_base": lambda: ModelConfig(d_model=768, num_heads=12, d_ff=3072, num_encoder_layers=12,
                                   num_decoder_layers=12),
    "t5_large": lambda: ModelConfig(d_model=1024, num_heads=16, d_ff=4096, num_encoder_layers=24,
                                    num_decoder_layers=24),
    "t5_1_1_small": lambda: ModelConfig(d_model=512, num_heads=6, d_ff=1024, num_encoder_layers=8,
                                        num_decoder_layers=8, **_T5_V1_1),
    "t5_1_1_base": lambda: ModelConfig(d_model=768, num_heads=12, d_ff=2048, num_encoder_layers=12,
                                       num_decoder_layers=12, **_T5_V1_1),
    "t5_1_1_large": lambda: ModelConfig(d_model=1024, num_heads=16, d_ff=2816, num_encoder_layers=24,
                                        num_decoder_layers=24, **_T5_V1_1),
    "t5_tiny": lambda: ModelConfig(**_TINY),
    "t5_1_1_tiny": lambda: ModelConfig(**{**_TINY, **_T5_V1_1}),
}


def get_config(name: str, **overrides) -> ModelConfig:
    """A named preset, optionally with fields replaced (`get_config("t5_small", dtype="bfloat16")`)."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown model preset {name!r}.{hint} Known presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]().replace(**overrides)
