"""Model configuration: one frozen dataclass for every family, and the named presets.

A preset is a value; gin or code derives variants with `dataclasses.replace`, never by copying.
The three families differ only in `arch` and a handful of layout fields:

| family              | arch            | norm  | norm_position | positions              | biases |
|---------------------|-----------------|-------|---------------|------------------------|--------|
| T5 (v1.0, v1.1)     | encoder_decoder | rms   | pre           | t5_relative            | no     |
| BART                | encoder_decoder | layer | post          | learned (offset 2)     | yes    |
| BERT and variants   | encoder         | layer | post          | learned (+ token type) | yes    |
| DeBERTa-v3          | encoder         | layer | post          | disentangled           | yes    |
| GPT-2               | decoder         | layer | pre           | learned                | yes    |
| ViT                 | encoder         | layer | pre           | learned (over patches) | yes    |
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Callable

from t5lite.errors import CheckpointError, ConfigError, UnknownNameError, first_line
from t5lite.models.recurrent_config import AWDLSTMConfig, BiLMConfig, RECURRENT_PRESETS
from t5lite.models.replaceable import Replaceable
from t5lite.models.static_config import STATIC_PRESETS, Word2VecConfig

ARCHITECTURES = ("encoder", "decoder", "encoder_decoder")
POSITION_ENCODINGS = ("none", "learned", "sinusoidal", "t5_relative", "shaw_relative", "rotary", "disentangled")
ENCODER_HEADS = ("mlm", "discriminator", "none")
# The fields an encoder-decoder's decoder may read with its own values (`decoder_overrides`): those
# that change no parameter's shape but the position table's, and no layer's structure.
DECODER_FIELDS = ("mlp_activations", "layer_norm_epsilon", "max_position_embeddings")


@dataclasses.dataclass(frozen=True)
class ModelConfig(Replaceable):
    arch: str = "encoder_decoder"
    vocab_size: int = 32128
    d_model: int = 512
    num_heads: int = 8
    head_dim: int = 64
    d_ff: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    # ("relu",) is a plain MLP; ("gelu", "linear") is T5 v1.1's gated GELU. "gelu" is the tanh
    # approximation (HF "gelu_new"), "gelu_exact" the erf form (HF "gelu").
    mlp_activations: tuple[str, ...] = ("relu",)
    dropout_rate: float = 0.1
    # Dropout on the MLP's hidden units: T5's, and BART's activation_dropout (0 by default); BERT and GPT-2 have none.
    mlp_dropout: bool = True

    # Block layout.
    norm: str = "rms"                 # "rms" (T5: scale only) or "layer" (mean, scale and bias)
    norm_position: str = "pre"        # "pre" (T5, GPT-2) or "post" (BERT, BART: norm after the residual add)
    final_norm: bool = True           # a norm after the last layer (pre-norm stacks need one)
    embedding_norm: bool = False      # a norm on the summed embeddings (BERT; BART's layernorm_embedding)
    use_bias: bool = False            # biases on every dense layer (everything but T5)
    scale_attention: bool = False     # q.k / sqrt(head_dim); T5 folds the scale into q's init instead
    layer_norm_epsilon: float = 1e-6
    # Parameter init: None is T5X's (t5x/examples/t5): fan-in scaled normal attention kernels (q also
    # / sqrt(head_dim)), fan-in scaled truncated normal MLP and output kernels, N(0, 1) token
    # embeddings, fan-avg uniform relative-position biases. A float is Hugging Face's
    # `_init_weights`: every kernel and embedding N(0, init_std) (BERT's 0.02; see
    # `zero_pad_embedding` and `scale_residual_init`). tests/test_reference_init.py checks both.
    init_std: float | None = None

    # Embeddings.
    pad_token_id: int = 0             # padding mask of encoder inputs; RoBERTa and BART use 1
    # Decoding and scoring (Hugging Face's names): an encoder-decoder's first decoder input (a
    # decoder-only model's BOS, fed when a prompt is empty), the id that ends a sequence (padding
    # follows it), and whether a decoder-only model is a prefix LM (attends bidirectionally over
    # its prompt, as trained with `decoder_causal_attention`).
    decoder_start_token_id: int = 0
    eos_token_id: int = 1
    prefix_lm: bool = False
    embedding_size: int | None = None  # factorised embedding V x E then E x H (ALBERT, ELECTRA); None: no projection
    type_vocab_size: int = 0          # BERT's segment (sentence A/B) embeddings; 0: none
    scale_embeddings: bool = False    # token embeddings times sqrt(d_model) (BART's scale_embedding)
    max_position_embeddings: int = 512  # rows of a learned table, not counting `position_offset`
    position_offset: int = 0          # learned positions start at this row (RoBERTa, BART: 2)

    # Position encoding, selectable in every family. The bucket fields serve T5's buckets and
    # DeBERTa's "disentangled" attention (its position_buckets and max_relative_positions).
    position_encoding: str = "t5_relative"
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    shaw_max_distance: int = 16       # Shaw et al.: offsets are clipped to [-k, k]
    rotary_base: float = 10000.0
    # Longformer (t5lite.models.windowed_attention): each self-attention query sees the keys within
    # attention_window / 2 slots either side (even; one int, or one per layer; None: every key), every
    # attention_dilation-th slot. Tokens that `encoder_global_attention_mask` marks (a row's first
    # max_global_tokens) attend, and are attended by, every token, through their own projections.
    attention_window: int | tuple[int, ...] | None = None
    attention_dilation: int | tuple[int, ...] = 1
    max_global_tokens: int = 16

    # Images (the Vision Transformer, t5lite.models.vision): image_size > 0 makes the encoder read
    # `encoder_input_images` [batch, image_size, image_size, num_channels] as patch_size x patch_size
    # patches, after a learned [CLS] vector (image_pooling="cls", read by a classifier) or without one
    # (a classifier reads the patches' "mean"); learned positions count the patches and the [CLS].
    image_size: int = 0
    patch_size: int = 16
    num_channels: int = 3
    image_pooling: str = "cls"

    share_layers: bool = False        # ALBERT: one set of layer parameters applied num_layers times
    # T5 Table 2's "enc-dec, shared": the encoder runs the decoder's layers (their self-attention,
    # MLP, norms, relative-position table), bidirectionally and without cross-attention.
    share_encoder_decoder: bool = False
    # (field, value) pairs of DECODER_FIELDS the decoder stack and the LM head read instead of the
    # encoder's: an image-to-text model joins two released halves (ViT's erf GELU and 1e-12 epsilon
    # over 197 positions, GPT-2's tanh GELU and 1e-5 over 1024), as Hugging Face's
    # VisionEncoderDecoderModel keeps each half's config.
    decoder_overrides: tuple[tuple[str, object], ...] = ()

    # Output heads.
    tie_embeddings: bool = True       # LM / MLM output projection reuses the token embedding
    scale_tied_logits: bool = True    # T5 v1.0 scales by d_model**-0.5 before tied logits
    logits_bias: bool = False         # BART's final_logits_bias
    encoder_head: str = "mlm"         # what an encoder's __call__ returns: "mlm", "discriminator", "none"
    pooler: bool = False              # dense + tanh on the first token (BERT, ALBERT)
    pooler_activation: str = "tanh"   # the pooler's activation: DeBERTa's ContextPooler has a GELU ("gelu_exact")
    sentence_head: bool = False       # 2-way classifier on the pooler: BERT's NSP, ALBERT's SOP
    span_boundary_head: bool = False  # SpanBERT's span boundary objective (a pre-training head of encoders)

    # Activation dtype; params stay float32. "bfloat16" on TPU.
    dtype: str = "float32"
    # "einsum" (explicit softmax; required for Shaw embeddings and attention dropout), "jax"
    # (jax.nn.dot_product_attention, XLA's fused attention on any device) or "cudnn" (the same call
    # with cuDNN's fused kernel: NVIDIA GPUs, bfloat16 or float16 activations).
    attention_impl: str = "einsum"
    scan_layers: bool = False
    # "none", "full" (recompute everything) or "minimal" (save matmul outputs).
    remat_policy: str = "none"
    # "int8": dense kernels and embedding tables are int8 with per-output-channel scales
    # (t5lite.models.quantization), an inference model `t5lite convert --quantize int8` writes.
    # "int4": a storage format (`--quantize int4`): packed int4 kernels on disk, computed in float32.
    weight_quantization: str = "none"

    def __post_init__(self):
        choices = dict(arch=ARCHITECTURES, position_encoding=POSITION_ENCODINGS, encoder_head=ENCODER_HEADS,
                       norm=("rms", "layer"), norm_position=("pre", "post"), attention_impl=("einsum", "jax", "cudnn"),
                       remat_policy=("none", "full", "minimal"), weight_quantization=("none", "int8", "int4"),
                       image_pooling=("cls", "mean"), pooler_activation=("tanh", "gelu", "gelu_exact"))
        for field, allowed in choices.items():
            if getattr(self, field) not in allowed:
                raise ConfigError(f"model config {field}={getattr(self, field)!r}: expected one of {allowed}")
        if self.attention_window is not None:
            self._check_window_fields()
        if self.sentence_head and not self.pooler:
            raise ConfigError("sentence_head=True needs pooler=True (NSP / SOP read the pooled first token)")
        if self.share_encoder_decoder and (self.arch != "encoder_decoder"
                                           or self.num_encoder_layers != self.num_decoder_layers):
            raise ConfigError("share_encoder_decoder=True shares an encoder-decoder's layers: it needs "
                              "arch='encoder_decoder' and num_encoder_layers == num_decoder_layers")
        if self.span_boundary_head and (self.arch != "encoder" or self.encoder_head != "mlm"):
            raise ConfigError("span_boundary_head=True is SpanBERT's pre-training head: it needs arch='encoder' with "
                             "encoder_head='mlm'")
        if self.image_size:
            self._check_image_fields()
        if self.decoder_overrides:
            self._check_decoder_overrides()

    def _check_decoder_overrides(self):
        fields = dict(self.decoder_overrides)
        if self.arch != "encoder_decoder" or self.share_encoder_decoder:
            raise ConfigError(f"decoder_overrides={self.decoder_overrides!r} needs a decoder of its own: "
                              "arch='encoder_decoder' with share_encoder_decoder=False")
        unknown = sorted(set(fields) - set(DECODER_FIELDS))
        if unknown or len(fields) != len(self.decoder_overrides):
            raise ConfigError(f"decoder_overrides names {unknown or 'a field twice'}: a decoder may differ from "
                              f"its encoder in {', '.join(DECODER_FIELDS)}, each named once")
        activations = fields.get("mlp_activations", self.mlp_activations)
        if not isinstance(activations, tuple) or len(activations) != len(self.mlp_activations):
            raise ConfigError(f"decoder_overrides mlp_activations={activations!r}: give a tuple of "
                              f"{len(self.mlp_activations)} like the encoder's {self.mlp_activations!r} (a gated "
                              "and a plain MLP differ in their parameters)")

    def decoder_config(self) -> "ModelConfig":
        """The config the decoder stack and the LM head read: this one with `decoder_overrides` applied
        (its image fields dropped: the decoder reads tokens)."""
        if not self.decoder_overrides:
            return self
        return self.replace(decoder_overrides=(), image_size=0, **dict(self.decoder_overrides))

    def _check_image_fields(self):
        if self.image_size % self.patch_size or self.arch == "decoder":
            raise ConfigError(f"image_size={self.image_size} must be a multiple of patch_size={self.patch_size}, "
                              f"in an encoder or encoder-decoder (arch={self.arch!r})")
        if self.position_encoding == "learned" and self.max_position_embeddings < self.image_positions:
            raise ConfigError(f"max_position_embeddings={self.max_position_embeddings} is less than the "
                              f"{self.image_positions} positions of the image's patches and [CLS]; set it to "
                              f"{self.image_positions}")

    @property
    def image_positions(self) -> int:
        """The encoder's positions for an image: one per patch, plus the [CLS] vector (image_pooling="cls")."""
        return (self.image_size // self.patch_size) ** 2 + (self.image_pooling == "cls")

    def _check_window_fields(self):
        layers = {n for n in (self.num_encoder_layers, self.num_decoder_layers) if n}
        for name, even in (("attention_window", True), ("attention_dilation", False)):
            value = getattr(self, name)
            if isinstance(value, tuple) and {len(value)} != layers:
                raise ConfigError(f"model config {name}={value!r} has {len(value)} entries for stacks of "
                                  f"{sorted(layers)} layers; give one per layer, or one int for all")
            if not all(isinstance(v, int) and v > 0 and not (even and v % 2)
                       for v in (value if isinstance(value, tuple) else (value,))):
                raise ConfigError(f"model config {name}={value!r}: expected positive{' even' if even else ''} ints")
            if self.scan_layers and isinstance(value, tuple) and len(set(value)) > 1:
                raise ConfigError(f"scan_layers=True runs one layer's code for every layer: give {name} one int "
                                  "for all layers, or set scan_layers=False")
        if self.position_encoding in ("shaw_relative", "disentangled"):
            raise ConfigError(f"attention_window does not combine with position_encoding={self.position_encoding!r} "
                              "(it reads offsets per query-key pair); use t5_relative, rotary, learned or sinusoidal")

    @property
    def zero_pad_embedding(self) -> bool:
        """Whether the token embedding's pad_token_id row starts at zero: Hugging Face's padding_idx,
        which every Hugging Face-style family (`init_std` set) but GPT-2 (the decoder-only one) has."""
        return self.init_std is not None and self.arch != "decoder"

    @property
    def scale_residual_init(self) -> bool:
        """Whether kernels writing into the residual stream (attention out, MLP wo) start with
        init_std / sqrt(2 x layers): GPT-2's c_proj (Hugging Face's GPT2PreTrainedModel._init_weights)."""
        return self.init_std is not None and self.arch == "decoder"

    @property
    def embed_dim(self) -> int:
        """Width of the token embedding table (E); d_model unless factorised."""
        return self.embedding_size or self.d_model



_T5_V1_1 = dict(mlp_activations=("gelu", "linear"), tie_embeddings=False, scale_tied_logits=False, dropout_rate=0.0)
_TINY = dict(vocab_size=2176, d_model=128, num_heads=4, head_dim=32, d_ff=512, num_encoder_layers=2,
             num_decoder_layers=2)

# Fields shared by the Hugging Face-style (post-2018) families.
_HF_STYLE = dict(norm="layer", use_bias=True, scale_attention=True, init_std=0.02, scale_tied_logits=False, mlp_dropout=False,
                 position_encoding="learned")
_BERT = dict(_HF_STYLE, arch="encoder", vocab_size=30522, d_model=768, num_heads=12, head_dim=64, d_ff=3072,
             num_encoder_layers=12, num_decoder_layers=0, mlp_activations=("gelu_exact",), norm_position="post",
             final_norm=False, embedding_norm=True, layer_norm_epsilon=1e-12, type_vocab_size=2, pooler=True,
             sentence_head=True)
_ROBERTA = dict(_BERT, vocab_size=50265, pad_token_id=1, position_offset=2, type_vocab_size=1, pooler=False,
                sentence_head=False,
                layer_norm_epsilon=1e-5)
_ALBERT = dict(_BERT, vocab_size=30000, embedding_size=128, share_layers=True, mlp_activations=("gelu",))
_ELECTRA = dict(_BERT, embedding_size=128, d_model=256, num_heads=4, d_ff=1024, pooler=False, sentence_head=False,
                encoder_head="discriminator")
# DeBERTa-v3: BERT's layout with disentangled attention (content<->position, log buckets) instead
# of absolute positions, and no token types.
_DEBERTA_V3 = dict(_BERT, vocab_size=128100, position_encoding="disentangled", relative_attention_num_buckets=256,
                   relative_attention_max_distance=512, type_vocab_size=0, layer_norm_epsilon=1e-7, pooler=False,
                   sentence_head=False)
_GPT2 = dict(_HF_STYLE, arch="decoder", vocab_size=50257, d_model=768, num_heads=12, head_dim=64, d_ff=3072,
             num_encoder_layers=0, num_decoder_layers=12, mlp_activations=("gelu",), layer_norm_epsilon=1e-5,
             max_position_embeddings=1024, decoder_start_token_id=50256, eos_token_id=50256)
_BART = dict(_HF_STYLE, vocab_size=50265, d_model=768, num_heads=12, head_dim=64, d_ff=3072, num_encoder_layers=6,
             num_decoder_layers=6, mlp_activations=("gelu_exact",), norm_position="post", final_norm=False,
             embedding_norm=True, layer_norm_epsilon=1e-5, pad_token_id=1, position_offset=2,
             max_position_embeddings=1024, logits_bias=True, decoder_start_token_id=2, eos_token_id=2)
# The Vision Transformer (Dosovitskiy et al. 2021, Table 1; Touvron et al. 2021's Ti and S): pre-norm
# BERT-sized layers on 16 x 16 patches of 224 x 224 RGB images, as google/vit-base-patch16-224.
_VIT = dict(_HF_STYLE, arch="encoder", vocab_size=0, d_model=768, num_heads=12, head_dim=64, d_ff=3072,
            num_encoder_layers=12, num_decoder_layers=0, mlp_activations=("gelu_exact",), layer_norm_epsilon=1e-12,
            dropout_rate=0.0, encoder_head="none", image_size=224, patch_size=16, num_channels=3,
            max_position_embeddings=197)
_HF_TINY = dict(d_model=64, num_heads=4, head_dim=16, d_ff=128, max_position_embeddings=64)


def _tiny(base: dict, **more) -> Callable[[], ModelConfig]:
    layers = {k: min(v, 2) for k, v in base.items() if k.startswith("num_") and k.endswith("_layers")}
    return lambda: ModelConfig(**{**base, **_HF_TINY, "vocab_size": 1000, **layers, **more})


PRESETS: dict[str, Callable[[], ModelConfig]] = {
    # T5 (encoder-decoder, relative position buckets, RMS pre-norm).
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
    "t5_1_1_xl": lambda: ModelConfig(d_model=2048, num_heads=32, d_ff=5120, num_encoder_layers=24,
                                     num_decoder_layers=24, **_T5_V1_1),
    "t5_1_1_xxl": lambda: ModelConfig(d_model=4096, num_heads=64, d_ff=10240, num_encoder_layers=24,
                                      num_decoder_layers=24, **_T5_V1_1),
    "t5_tiny": lambda: ModelConfig(**_TINY),
    "t5_1_1_tiny": lambda: ModelConfig(**{**_TINY, **_T5_V1_1}),
    # BERT family (encoder).
    "bert_base": lambda: ModelConfig(**_BERT),
    "bert_large": lambda: ModelConfig(**{**_BERT, "d_model": 1024, "num_heads": 16, "d_ff": 4096,
                                         "num_encoder_layers": 24}),
    "bert_tiny": _tiny(_BERT),
    # all-MiniLM-L6-v2 (sentence-transformers): BERT's layout at 6 x 384, no pre-training heads.
    "minilm_l6_h384": lambda: ModelConfig(**{**_BERT, "d_model": 384, "head_dim": 32, "d_ff": 1536,
                                             "num_encoder_layers": 6, "encoder_head": "none", "sentence_head": False}),
    # Its 3-layer student (t5lite.objectives.distillation: every other layer, [0, 2, 4]).
    "minilm_l3_h384": lambda: PRESETS["minilm_l6_h384"]().replace(num_encoder_layers=3),
    "roberta_base": lambda: ModelConfig(**_ROBERTA),
    "roberta_large": lambda: ModelConfig(**{**_ROBERTA, "d_model": 1024, "num_heads": 16, "d_ff": 4096,
                                            "num_encoder_layers": 24}),
    "roberta_tiny": _tiny(_ROBERTA),
    "albert_base": lambda: ModelConfig(**_ALBERT),
    "albert_large": lambda: ModelConfig(**{**_ALBERT, "d_model": 1024, "num_heads": 16, "d_ff": 4096,
                                           "num_encoder_layers": 24}),
    "albert_tiny": _tiny(_ALBERT, embedding_size=32),
    "electra_small": lambda: ModelConfig(**_ELECTRA),
    "electra_small_generator": lambda: ModelConfig(**{**_ELECTRA, "encoder_head": "mlm"}),
    "electra_base": lambda: ModelConfig(**{**_ELECTRA, "embedding_size": None, "d_model": 768, "num_heads": 12,
                                           "d_ff": 3072}),
    "electra_base_generator": lambda: ModelConfig(**{**_ELECTRA, "embedding_size": 768, "encoder_head": "mlm"}),
    "electra_tiny": _tiny(_ELECTRA, embedding_size=32),
    "electra_tiny_generator": _tiny(_ELECTRA, embedding_size=32, d_model=48, num_heads=3, d_ff=96,
                                    encoder_head="mlm"),
    "deberta_v3_base": lambda: ModelConfig(**_DEBERTA_V3),
    "deberta_v3_tiny": _tiny(_DEBERTA_V3, relative_attention_num_buckets=16, relative_attention_max_distance=64),
    # GPT-2 (decoder only).
    "gpt2_small": lambda: ModelConfig(**_GPT2),
    "gpt2_medium": lambda: ModelConfig(**{**_GPT2, "d_model": 1024, "num_heads": 16, "d_ff": 4096,
                                          "num_decoder_layers": 24}),
    "gpt2_large": lambda: ModelConfig(**{**_GPT2, "d_model": 1280, "num_heads": 20, "d_ff": 5120,
                                         "num_decoder_layers": 36}),
    "gpt2_xl": lambda: ModelConfig(**{**_GPT2, "d_model": 1600, "num_heads": 25, "d_ff": 6400,
                                      "num_decoder_layers": 48}),
    # GPT-2 starts and ends with its one `<|endoftext|>`; t5lite's tiny vocabularies (SentencePiece and
    # byte-level BPE) end with `</s>` = 1, so that is the tiny one's start and end.
    "gpt2_tiny": _tiny(_GPT2, decoder_start_token_id=1, eos_token_id=1),
    # BART (encoder-decoder, learned positions, post-norm).
    "bart_base": lambda: ModelConfig(**_BART),
    "bart_large": lambda: ModelConfig(**{**_BART, "d_model": 1024, "num_heads": 16, "d_ff": 4096,
                                         "num_encoder_layers": 12, "num_decoder_layers": 12}),
    "bart_tiny": _tiny(_BART, decoder_start_token_id=1, eos_token_id=1),   # `</s>` of the tiny vocabularies
    # Vision Transformers (encoder on image patches); vit_tiny reads scikit-learn's 8 x 8 digits.
    "vit_b16": lambda: ModelConfig(**_VIT),
    "vit_s16": lambda: ModelConfig(**{**_VIT, "d_model": 384, "num_heads": 6, "d_ff": 1536}),
    "vit_ti16": lambda: ModelConfig(**{**_VIT, "d_model": 192, "num_heads": 3, "d_ff": 768}),
    "vit_tiny": lambda: ModelConfig(**{**_VIT, **_HF_TINY, "num_encoder_layers": 2, "image_size": 8, "patch_size": 2,
                                       "num_channels": 1, "max_position_embeddings": 17}),
    # An image-to-text encoder-decoder: ViT's encoder and GPT-2's decoder (pre-norm LayerNorm layers,
    # learned positions, exact GELU), Hugging Face's VisionEncoderDecoderModel(ViTModel, GPT2LMHeadModel),
    # with T5's ids (decoding starts from pad 0, ends at </s> 1) and the tiny vocabularies' rows.
    "vit_gpt2_tiny": lambda: ModelConfig(**{**_VIT, **_HF_TINY, "arch": "encoder_decoder", "vocab_size": 2176,
                                            "num_encoder_layers": 2, "num_decoder_layers": 2, "image_size": 8,
                                            "patch_size": 2, "num_channels": 1, "max_position_embeddings": 17}),
}


def get_config(name: str, **overrides) -> ModelConfig:
    """A named preset, optionally with fields replaced (`get_config("t5_small", dtype="bfloat16")`);
    the recurrent families' presets (`elmo_*`, `awd_lstm*`) and word2vec's (`word2vec*`) return their
    own config classes."""
    presets = {**PRESETS, **RECURRENT_PRESETS, **STATIC_PRESETS}
    if name not in presets:
        close = difflib.get_close_matches(name, presets, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownNameError(f"unknown model preset {name!r}.{hint} Known presets: {', '.join(sorted(presets))}")
    return presets[name]().replace(**overrides)


_CONFIG_CLASSES = {"bilm": BiLMConfig, "awd_lstm": AWDLSTMConfig, "word2vec": Word2VecConfig}


def save_config(config: ModelConfig, path: str) -> None:
    """Writes the config as JSON (runs keep it as `model_config.json` next to their checkpoints)."""
    import json

    from etils import epath
    epath.Path(path).write_text(json.dumps(dataclasses.asdict(config), indent=1, sort_keys=True), encoding="utf-8")


def json_tuples(value):
    """JSON's lists as the tuples a frozen config holds (nested ones too)."""
    return tuple(json_tuples(v) for v in value) if isinstance(value, list) else value


def load_config(path: str) -> ModelConfig:
    """A config `save_config` wrote (a recurrent or static family's by its `arch`); a file that is not one is
    a CheckpointError naming it."""
    import json

    from etils import epath
    try:
        fields = json.loads(epath.Path(path).read_text(encoding="utf-8"))
        cls = _CONFIG_CLASSES.get(fields.get("arch"), ModelConfig)
        if cls is not ModelConfig:
            fields.pop("arch")
        return cls(**{k: json_tuples(v) for k, v in fields.items()})
    except (ValueError, TypeError, AttributeError) as e:     # bad JSON, unknown or invalid fields, not an object
        raise CheckpointError(f"{path} is not a t5lite model config ({first_line(e)}); restore a good copy of "
                              "it (runs and `t5lite convert` write it next to the checkpoints)") from None


def config_changes(old: ModelConfig, new: ModelConfig) -> dict[str, tuple]:
    """{field: (old value, new value)} for each field that differs, in declaration order."""
    if type(old) is not type(new):
        return {"arch": (old.arch, new.arch)}
    return {f.name: (getattr(old, f.name), getattr(new, f.name)) for f in dataclasses.fields(old)
            if getattr(old, f.name) != getattr(new, f.name)}
