"""FLOPs by formula: what a forward or training pass of a model costs, from its config and lengths.

A decoder-only model is counted exactly as MaxText's `calculate_tflops_training_per_device`
(MaxText/maxtext_utils.py, its dense branch; tests/test_reference_flops.py transcribes it): per
token, 2 FLOPs per multiply-add of every matmul with a parameter (attention q/k/v/out, MLP, the
output head over the vocabulary) plus the two attention matmuls QK^T and AV halved under the
causal mask, times 3 for forward + backward. That is 6 x (matmul parameters) + 6 x layers x
length x heads x head_dim per token. Prefix LMs are counted as causal, as MaxText counts every
decoder. MaxText has no encoder or encoder-decoder formula; for those t5lite applies the same
per-matmul rule to what it adds: encoder stacks with bidirectional attention (not halved),
cross-attention (q and out over the target positions, k and v over the encoder's, QK^T and AV
over target x encoder positions), the MLM (or ELECTRA discriminator) head over every encoder
position, the factorised-embedding projection (ALBERT, ELECTRA) and ALBERT's shared layers once
per use; an encoder-decoder's LM head runs over the target positions only. Not counted, by
either: rematerialisation, norms, softmax and other elementwise work, embedding lookups, and
(t5lite only) the extra position matmuls of Shaw and DeBERTa relative attention.

The recurrent families count the same way per word: 4 gates x (input + recurrent state) per LSTM
step (ELMo: plus its projection, both directions), ELMo's char CNN and highway layers, and the word
softmax of a language model; a word classifier counts what runs instead (`pooled_classifier_macs`,
no softmax).

Padding is not useful work: `real_counts` counts a batch's non-pad tokens and its examples, and
the trainer reports MFU on the real tokens (the step's FLOPs per padded token, at the row length,
times the real ones), next to the padded figure. Measuring the devices' peak is
t5lite.train.mfu's job.
"""
from __future__ import annotations

import numpy as np

from t5lite.models.config import ModelConfig


def _self_attention_macs(cfg: ModelConfig, length: int, causal: bool) -> float:
    width = cfg.num_heads * cfg.head_dim
    projections = 4 * cfg.d_model * width * length          # q, k, v, out
    scores = 2 * length * length * width                    # QK^T and AV
    return projections + (scores / 2 if causal else scores)


def _cross_attention_macs(cfg: ModelConfig, q_len: int, kv_len: int) -> float:
    width = cfg.num_heads * cfg.head_dim
    return 2 * cfg.d_model * width * (q_len + kv_len) + 2 * q_len * kv_len * width


def _stack_macs(cfg: ModelConfig, num_layers: int, length: int, causal: bool, encoder_length: int = 0) -> float:
    """One encoder or decoder stack (with cross-attention when `encoder_length`)."""
    layer = _self_attention_macs(cfg, length, causal) + (len(cfg.mlp_activations) + 1) * cfg.d_model * cfg.d_ff * length
    if encoder_length:
        layer += _cross_attention_macs(cfg, length, encoder_length)
    projection = cfg.embed_dim * cfg.d_model * length if cfg.embedding_size is not None else 0
    return num_layers * layer + projection


def _head_macs(cfg: ModelConfig, length: int) -> float:
    """The output head over `length` predicted positions."""
    if cfg.arch != "encoder":
        return cfg.d_model * cfg.vocab_size * length
    per_token = {"mlm": cfg.d_model * cfg.embed_dim + cfg.embed_dim * cfg.vocab_size,
                 "discriminator": cfg.d_model * cfg.d_model + cfg.d_model, "none": 0}[cfg.encoder_head]
    return per_token * length


def forward_flops_per_example(cfg: ModelConfig, encoder_length: int = 0, decoder_length: int = 0) -> float:
    """Forward FLOPs of one example; lengths are the model's (packed) feature lengths.

    Encoders read `encoder_length`, decoders `decoder_length` (prompt and target together),
    encoder-decoders both."""
    needs = {"encoder": ("encoder_length",), "decoder": ("decoder_length",),
             "encoder_decoder": ("encoder_length", "decoder_length")}[cfg.arch]
    lengths = dict(encoder_length=encoder_length, decoder_length=decoder_length)
    missing = [name for name in needs if lengths[name] <= 0]
    if missing:
        raise ValueError(f"a {cfg.arch} model's FLOP count needs {' and '.join(needs)} > 0; got {lengths}")
    if cfg.arch == "encoder":
        macs = _stack_macs(cfg, cfg.num_encoder_layers, encoder_length, False) + _head_macs(cfg, encoder_length)
    elif cfg.arch == "decoder":
        macs = _stack_macs(cfg, cfg.num_decoder_layers, decoder_length, True) + _head_macs(cfg, decoder_length)
    else:
        macs = (_stack_macs(cfg, cfg.num_encoder_layers, encoder_length, False)
                + _stack_macs(cfg, cfg.num_decoder_layers, decoder_length, True, encoder_length)
                + _head_macs(cfg, decoder_length))
    return 2 * macs


def train_flops_per_example(cfg: ModelConfig, encoder_length: int = 0, decoder_length: int = 0) -> float:
    """Forward + backward FLOPs of one example (the backward pass costs twice the forward); the
    recurrent language models (ELMo's biLM, AWD-LSTM) count theirs per word of `encoder_length`."""
    if cfg.arch in RECURRENT_ENCODERS:
        return 3 * 2 * recurrent_lm_macs_per_word(cfg) * encoder_length
    return 3 * forward_flops_per_example(cfg, encoder_length, decoder_length)


def lstm_macs(input_dim: int, hidden_dim: int, projection_dim: int = 0) -> int:
    """One LSTM step: 4 gates over the input and the recurrent state (the projected state when
    `projection_dim`, as ELMo's LSTMs), plus that projection."""
    state = projection_dim or hidden_dim
    return 4 * hidden_dim * (input_dim + state) + hidden_dim * projection_dim


def _bilm_encoder_macs(cfg) -> float:
    """ELMo per word: char CNN (a filter of width w at each of the 50 - w + 1 positions it fits in a
    word's 50 characters), highway layers and their projection, then both directions' LSTM stacks."""
    n_filters = sum(n for _, n in cfg.filters)
    cnn = sum(w * cfg.char_embed_dim * n * (50 - w + 1) for w, n in cfg.filters)
    highway = cfg.n_highway * 2 * n_filters ** 2 + n_filters * cfg.projection_dim
    lstm = 2 * cfg.n_layers * lstm_macs(cfg.projection_dim, cfg.lstm_dim, cfg.projection_dim)
    return cnn + highway + lstm


def _awd_lstm_encoder_macs(cfg) -> float:
    return sum(lstm_macs(i, h) for i, h in cfg.layer_dims())


RECURRENT_ENCODERS = {"bilm": _bilm_encoder_macs, "awd_lstm": _awd_lstm_encoder_macs}   # arch -> MACs per word


def recurrent_encoder_macs_per_word(cfg) -> float:
    """A recurrent config's encoder per word, without the word softmax (a classifier's backbone)."""
    return RECURRENT_ENCODERS[cfg.arch](cfg)


def recurrent_features(cfg) -> int:
    """The width of the word vectors a recurrent encoder outputs (ELMo: both directions' projections)."""
    return 2 * cfg.projection_dim if cfg.arch == "bilm" else cfg.emb_dim


def recurrent_lm_macs_per_word(cfg) -> float:
    """A recurrent language model per word: its encoder and its word softmax over the encoder's
    output (ELMo: each direction's projection)."""
    return recurrent_encoder_macs_per_word(cfg) + recurrent_features(cfg) * cfg.vocab_size


def pooled_classifier_macs(features: int, length: int, task_model: str, hidden: int, num_labels: int) -> float:
    """A word classifier's own model over `length` words of `features`-wide vectors: a BiLSTM of
    `hidden` units (`task_model="bilstm"`, both directions; "linear" or None: none), concat pooling
    (last, max, mean: 3x the width) and the pooled head (`hidden` ReLU units, then the labels)."""
    width = features
    macs = 0
    if task_model == "bilstm":
        macs, width = 2 * lstm_macs(features, hidden) * length, 2 * hidden
    return macs + 3 * width * hidden + hidden * num_labels


def encode_flops(cfg: ModelConfig, length: int) -> float:
    """Forward FLOPs of the stack `encode` runs over `length` tokens, the one a task head or a
    pooling reads (an encoder-decoder's encoder, a decoder-only model's causal decoder); no LM head."""
    if cfg.arch == "decoder":
        return 2 * _stack_macs(cfg, cfg.num_decoder_layers, length, True)
    return 2 * _stack_macs(cfg, cfg.num_encoder_layers, length, False)


def bi_encoder_train_flops_per_example(cfg: ModelConfig, text_lengths) -> float:
    """Forward + backward FLOPs of one bi-encoder example: the encoder stack (no output head) over
    each of its texts."""
    return 3 * sum(encode_flops(cfg, n) for n in text_lengths)


def conditioned_decoder_train_flops_per_example(cfg: ModelConfig, num_layers: int, length: int,
                                                memory_length: int = 1) -> float:
    """Forward + backward FLOPs of a causal stack of `num_layers` over `length` tokens that
    cross-attends to `memory_length` vectors, with its LM head (Skip-Thought's decoders)."""
    return 3 * 2 * (_stack_macs(cfg, num_layers, length, True, memory_length) + cfg.d_model * cfg.vocab_size * length)


def real_counts(batch, image_tokens: int = 0) -> tuple[int, int]:
    """(non-pad tokens, examples) of a host batch of model features.

    A token is real where its `*_segment_ids` is > 0 (packed), else where `encoder_input_tokens`
    / `decoder_target_tokens` / a bi-encoder's `text<i>_input_tokens` is not 0 (decoder inputs
    start with a 0 BOS, their targets do not); each of `encoder_input_images` is `image_tokens`
    (the encoder's positions: its patches and [CLS], which the FLOPs count as its tokens);
    examples are the filled `label_weights` slots, else each row's segments, else the rows."""
    tokens = image_tokens * len(batch["encoder_input_images"]) if "encoder_input_images" in batch else 0
    for prefix, unpacked in (("encoder", "encoder_input_tokens"), ("decoder", "decoder_target_tokens")):
        segments = batch.get(f"{prefix}_segment_ids")
        source = segments if segments is not None else batch.get(unpacked)
        tokens += 0 if source is None else int(np.count_nonzero(source))
    tokens += sum(int(np.count_nonzero(v)) for k, v in batch.items()
                  if k.startswith("text") and k.endswith("_input_tokens"))
    if "label_weights" in batch:
        return tokens, int(np.count_nonzero(batch["label_weights"]))
    segments = batch.get("encoder_segment_ids", batch.get("decoder_segment_ids"))
    if segments is not None:
        return tokens, int(np.max(segments, axis=1).sum())
    return tokens, len(next(iter(batch.values())))
