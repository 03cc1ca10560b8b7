"""Feature-based use of a frozen ELMo (Peters et al., 2018, section 3.3): the biLM's layers, never
updated (gradients stop at them), mixed by a learned scalar mix, feed a small task model: a BiLSTM
(`task_model="bilstm"`) or nothing (`"linear"`), then concat pooling and a 50-unit classifier.
The biLM's params are `params["bilm"]`, as in the LM run they come from.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.errors import ConfigError
from t5lite.models.awd_lstm import PoolingClassifierHead, WeightDropLSTM, concat_pool
from t5lite.models.recurrent import BiLM, bilm_inputs, reverse_within_lengths
from t5lite.models.recurrent_config import BiLMConfig
from t5lite.models.scalar_mix import ScalarMix

TASK_MODELS = ("bilstm", "linear")


class FrozenELMoClassifier(nn.Module):
    """Word-classification features (`word_classification_chars`) -> logits [B, classes]."""
    config: BiLMConfig
    num_classes: int = 2
    task_model: str = "bilstm"
    hidden: int = 50
    dropout_rate: float = 0.2

    @nn.compact
    def __call__(self, encoder_input_tokens, encoder_input_chars, enable_dropout: bool = False):
        if self.task_model not in TASK_MODELS:
            raise ConfigError(f"task_model={self.task_model!r}: expected one of {TASK_MODELS}")
        cfg = self.config
        chars, lengths = bilm_inputs(encoder_input_tokens, encoder_input_chars)
        layers, _ = BiLM(cfg, name="bilm")(chars, lengths)
        mixed = ScalarMix(cfg.n_layers + 1, name="scalar_mix")(jax.lax.stop_gradient(layers))
        x = nn.Dropout(self.dropout_rate, deterministic=not enable_dropout)(mixed)
        if self.task_model == "bilstm":
            forward = WeightDropLSTM(x.shape[-1], self.hidden, name="forward_lstm")(x, lengths)
            backward = WeightDropLSTM(x.shape[-1], self.hidden, name="backward_lstm")(
                reverse_within_lengths(x, lengths), lengths)
            x = jnp.concatenate([forward, reverse_within_lengths(backward, lengths)], -1)
        pooled = concat_pool(x, lengths)
        return PoolingClassifierHead(self.num_classes, self.hidden, self.dropout_rate, name="head")(
            pooled, enable_dropout)
