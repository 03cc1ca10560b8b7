"""Hugging Face's VisionEncoderDecoderModel of a ViT encoder and a GPT-2 decoder with cross-attention
(transformers' vision_encoder_decoder): t5lite's image encoder-decoder (`vit_gpt2_tiny`). The ViT
and GPT-2 families translate the two halves of config.json and map their tensors under `encoder.`
and `decoder.`. The halves' activations, LayerNorm epsilons and position counts may differ (the
decoder's go to `ModelConfig.decoder_overrides`); t5lite's model has one width, head count and MLP
width for both stacks, so a folder whose halves differ there (Hugging Face then projects the
encoder's states with `enc_to_dec_proj`) is refused, naming the two fields."""
from __future__ import annotations

import numpy as np

from t5lite.interop.hf import vit
from t5lite.interop.hf.fields import HFConversionError, special_ids
from t5lite.interop.hf.gpt2 import GPT2Family
from t5lite.interop.hf.rules import Rule, prefixed
from t5lite.models.config import DECODER_FIELDS, ModelConfig

MODEL_TYPE = "vision-encoder-decoder"
PARTS = {"encoder": "vit", "decoder": "gpt2"}    # the model_type each half must have
# Fields both stacks share in t5lite -> (the encoder's config.json name, or what ViT fixes, in words;
# the decoder's name). The others of DECODER_FIELDS the decoder keeps as its own.
SHARED = {"d_model": ("hidden_size", "n_embd"), "num_heads": ("num_attention_heads", "n_head"),
          "d_ff": ("intermediate_size", "n_inner"), "scale_attention": ("the encoder's scaled attention", "scale_attn_weights")}


def _part(c: dict, name: str) -> dict:
    part = c.get(name)
    if not isinstance(part, dict):
        raise HFConversionError(f"a {MODEL_TYPE} config needs the object {name!r}, which this one lacks")
    if part.get("model_type") != PARTS[name]:
        raise HFConversionError(f"{name}.model_type={part.get('model_type')!r}: t5lite's image-to-text model "
                                f"imports a {PARTS['encoder']!r} encoder with a {PARTS['decoder']!r} decoder")
    return part


def _named(name: str) -> str:
    return name if " " in name else f"encoder.{name}"


def _shown(part: dict, name: str, cfg: ModelConfig, field: str) -> str:
    """A shared field's value as config.json gives it, else as t5lite reads it (a default, n_inner=None)."""
    value = part.get(name)
    return repr(value if value is not None else getattr(cfg, field))


def _translate(name: str, from_hf, part: dict) -> ModelConfig:
    """One half's t5lite config, its errors naming the half."""
    try:
        return from_hf(part, {})
    except HFConversionError as e:
        raise HFConversionError(f"{name}: {e}") from None
    except KeyError as e:
        raise HFConversionError(f"{name} needs the field {e.args[0]!r}, which this config lacks") from None


class VisionEncoderDecoderFamily:
    def from_hf(self, c: dict, tensors: dict[str, np.ndarray]) -> ModelConfig:
        encoder, decoder = _part(c, "encoder"), _part(c, "decoder")
        if not decoder.get("add_cross_attention"):
            raise HFConversionError("decoder.add_cross_attention is not true: t5lite's image-to-text decoder "
                                    "cross-attends to the image (needs true)")
        if not decoder.get("tie_word_embeddings", True):
            raise HFConversionError("decoder.tie_word_embeddings=False: t5lite's image-to-text decoder ties its LM "
                                    "head to the token embedding (needs true)")
        image = _translate("encoder", vit.ViTFamily().from_hf, encoder)
        text = _translate("decoder", GPT2Family.from_hf, {**decoder, "add_cross_attention": False})
        own = tuple((field, getattr(text, field)) for field in DECODER_FIELDS
                    if getattr(image, field) != getattr(text, field))
        for field, (encoder_name, decoder_name) in SHARED.items():
            if getattr(image, field) != getattr(text, field):
                raise HFConversionError(
                    f"decoder.{decoder_name}={_shown(decoder, decoder_name, text, field)} differs from "
                    f"{_named(encoder_name)}={_shown(encoder, encoder_name, image, field)}; t5lite's image-to-text "
                    f"model has one {field} for both stacks (needs equal values)")
        pad = c.get("pad_token_id")
        return image.replace(arch="encoder_decoder", vocab_size=text.vocab_size, pooler=False,
                             num_decoder_layers=text.num_decoder_layers, decoder_overrides=own,
                             pad_token_id=text.pad_token_id if pad is None else pad,
                             **special_ids(c, start=text.decoder_start_token_id, eos=text.eos_token_id))

    @staticmethod
    def to_hf(cfg: ModelConfig) -> dict:
        encoder = vit.ViTFamily().to_hf(cfg.replace(arch="encoder", num_decoder_layers=0, decoder_overrides=()))
        decoder = GPT2Family.to_hf(cfg.decoder_config().replace(arch="decoder", num_encoder_layers=0, image_size=0))
        return dict(model_type=MODEL_TYPE, architectures=["VisionEncoderDecoderModel"], is_encoder_decoder=True,
                    encoder=encoder, decoder={**decoder, "add_cross_attention": True, "is_decoder": True},
                    decoder_start_token_id=cfg.decoder_start_token_id, eos_token_id=cfg.eos_token_id,
                    pad_token_id=cfg.pad_token_id, tie_word_embeddings=False)

    @staticmethod
    def rules(cfg: ModelConfig) -> list[Rule]:
        return (prefixed(vit.ViTFamily().rules(cfg), f"{vit.PREFIX}.", "encoder.")
                + prefixed(GPT2Family.rules(cfg.decoder_config()), "", "decoder."))
