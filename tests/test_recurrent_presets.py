"""The recurrent presets: the released ELMo sizes (allennlp's published parameter counts), logical
axes on every parameter, and their configs saved and read back with a run."""
from __future__ import annotations

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from t5lite import models
from t5lite.models.config import config_changes, load_config, save_config
from t5lite.models.recurrent import BiLM
from t5lite.models.recurrent_config import AWDLSTMConfig, BiLMConfig

# allennlp's ELMo page: "Small 13.6M, Medium 28.0M, Original 93.6M" parameters (the biLM, no softmax).
PUBLISHED = {"elmo_small": 13.6e6, "elmo_medium": 28.0e6, "elmo_original": 93.6e6}


def _bilm_params(cfg):
    chars = jnp.ones((1, 3, 50), jnp.int32)
    return jax.eval_shape(lambda: BiLM(cfg).init(jax.random.key(0), chars, jnp.ones((1,), jnp.int32)))["params"]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_released_elmo_sizes_have_the_published_parameter_counts(name):
    n = sum(x.size for x in jax.tree.leaves(nn.unbox(_bilm_params(models.get_config(name)))))
    assert abs(n - PUBLISHED[name]) / PUBLISHED[name] < 0.005, n


@pytest.mark.parametrize("name", ["elmo_tiny", "awd_lstm_tiny"])
def test_every_recurrent_param_has_logical_axes(name):
    module = models.build(name)
    tokens = jnp.ones((1, 4), jnp.int32)
    features = {"encoder_input_tokens": tokens}
    if name.startswith("elmo"):
        features["encoder_input_chars"] = jnp.ones((1, 200), jnp.int32)
    params = jax.eval_shape(lambda: module.init(jax.random.key(0), **features))["params"]
    flat = flax.traverse_util.flatten_dict(params, is_leaf=lambda _, x: isinstance(x, nn.LogicallyPartitioned))
    for path, leaf in flat.items():
        assert isinstance(leaf, nn.LogicallyPartitioned) and len(leaf.names) == len(leaf.value.shape), path


def test_recurrent_configs_are_saved_and_compared_like_model_configs(tmp_path):
    for cfg in (models.get_config("elmo_tiny", vocab_size=100), models.get_config("awd_lstm_tiny")):
        save_config(cfg, str(tmp_path / "c.json"))
        assert load_config(str(tmp_path / "c.json")) == cfg
    elmo = models.get_config("elmo_tiny")
    assert isinstance(elmo, BiLMConfig) and isinstance(models.get_config("awd_lstm"), AWDLSTMConfig)
    assert config_changes(elmo, elmo.replace(lstm_dim=8)) == {"lstm_dim": (256, 8)}
    assert config_changes(elmo, models.get_config("t5_tiny")) == {"arch": ("bilm", "encoder_decoder")}
