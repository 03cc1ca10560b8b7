"""Feature-based classifiers: frozen word features (never updated: gradients stop at them) feed a
small task model — a BiLSTM (`task_model="bilstm"`) or nothing (`"linear"`), then concat pooling
and ULMFiT's 50-unit BatchNorm head (`PoolingLinearClassifier`: pooled frozen features vary across
sentences by a fraction of their size, and without BatchNorm most of its ReLUs die).

- `FrozenELMoClassifier`: ELMo's layers mixed by a learned scalar mix (Peters et al., 2018,
  section 3.3); the biLM's params are `params["bilm"]`, as in the LM run they come from.
- `FrozenStaticClassifier`: one static vector per word (GloVe, word2vec), the table in
  `params["static_embedding"]`, filled by `table_init` (the word-vocabulary rows of a vectors file).
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax

from t5lite.errors import ConfigError
from t5lite.models.awd_lstm import PoolingLinearClassifier, WeightDropLSTM, bidirectional, concat_pool, lengths_of
from t5lite.models.layers import param_with_axes
from t5lite.models.recurrent import BiLM, bilm_inputs
from t5lite.models.recurrent_config import BiLMConfig
from t5lite.models.scalar_mix import ScalarMix

TASK_MODELS = ("bilstm", "linear")


class FeatureTaskModel(nn.Module):
    """Frozen features [B, T, D] and lengths [B] -> dropout, the task model, concat pooling, logits."""
    num_classes: int = 2
    task_model: str = "bilstm"
    hidden: int = 50
    dropout_rate: float = 0.2

    @nn.compact
    def __call__(self, features, lengths, enable_dropout: bool = False):
        if self.task_model not in TASK_MODELS:
            raise ConfigError(f"task_model={self.task_model!r}: expected one of {TASK_MODELS}")
        x = nn.Dropout(self.dropout_rate, deterministic=not enable_dropout)(features)
        if self.task_model == "bilstm":
            x = bidirectional(WeightDropLSTM(x.shape[-1], self.hidden, name="forward_lstm"),
                              WeightDropLSTM(x.shape[-1], self.hidden, name="backward_lstm"), x, lengths)
        pooled = concat_pool(x, lengths)
        return PoolingLinearClassifier(self.num_classes, self.hidden, (self.dropout_rate, self.dropout_rate),
                                       name="head")(pooled, enable_dropout)


class FrozenELMoClassifier(nn.Module):
    """Word-classification features (`word_classification_chars`) -> logits [B, classes]."""
    config: BiLMConfig
    num_classes: int = 2
    task_model: str = "bilstm"
    hidden: int = 50
    dropout_rate: float = 0.2

    @nn.compact
    def __call__(self, encoder_input_tokens, encoder_input_chars, enable_dropout: bool = False):
        cfg = self.config
        chars, lengths = bilm_inputs(encoder_input_tokens, encoder_input_chars)
        layers, _ = BiLM(cfg, name="bilm")(chars, lengths)
        mixed = ScalarMix(cfg.n_layers + 1, name="scalar_mix")(jax.lax.stop_gradient(layers))
        return FeatureTaskModel(self.num_classes, self.task_model, self.hidden, self.dropout_rate,
                                name="task_model")(mixed, lengths, enable_dropout)


class FrozenStaticClassifier(nn.Module):
    """Word ids (`word_classification`) -> logits [B, classes] over a frozen [vocab, dim] table."""
    vocab_size: int
    dim: int
    table_init: Callable
    num_classes: int = 2
    task_model: str = "bilstm"
    hidden: int = 50
    dropout_rate: float = 0.2

    @nn.compact
    def __call__(self, encoder_input_tokens, enable_dropout: bool = False):
        table = param_with_axes(self, "static_embedding", self.table_init, (self.vocab_size, self.dim),
                                ("vocab", "embed"))
        features = jax.lax.stop_gradient(table)[encoder_input_tokens]
        return FeatureTaskModel(self.num_classes, self.task_model, self.hidden, self.dropout_rate,
                                name="task_model")(features, lengths_of(encoder_input_tokens), enable_dropout)
