"""GPT's causal LM pre-training (gin/objectives/causal_lm.gin: `train.objective = @CausalLmObjective()`):
the default token cross entropy over the packed document stream, read by a decoder-only model.

A pre-training stream has no prompt to generate from, so the run is evaluated as nanoGPT's
`estimate_loss` evaluates it: the split's rows, packed as training packs them, scored by the loss
without dropout or z-loss (t5lite.objectives.heldout). Training and evaluation log `perplexity`, the
exp of the mean token loss, as the recurrent LMs do.
"""
from __future__ import annotations

import gin
import jax.numpy as jnp

from t5lite import models
from t5lite.errors import ConfigError
from t5lite.objectives.base import Objective
from t5lite.objectives.heldout import LossEvaluator


@gin.configurable
class CausalLmObjective(Objective):
    """Next-token cross entropy of a decoder-only model, evaluated by its held-out loss, perplexity and
    next-token accuracy over every real target token of the split."""
    produces_text = False

    def __init__(self, converter: str = "decoder"):
        self.converter = converter   # the feature converter its evaluation reads: train.feature_converter's

    def build_model(self, config):
        if config.arch != "decoder":
            raise ConfigError(f"CausalLmObjective pre-trains a decoder-only model, but the model config has arch="
                              f"{config.arch!r}; use a gpt2_* preset")
        return models.build(config)

    def derived_metrics(self, metrics):
        return {**metrics, "perplexity": jnp.exp(metrics["loss"])}

    def evaluators(self, task, split, task_feature_lengths, batch_size=32, data_dir=None, max_examples=None, **_):
        return {task.name: LossEvaluator(self, task, split, task_feature_lengths, batch_size, data_dir, max_examples,
                                         pack=True)}
