"""ELMo's layer outputs for whitespace-tokenised sentences, from a biLM's variables (the original
files through `t5lite.interop.elmo.load`) or a t5lite ELMo run (`load_run`): what `t5lite embed`,
`t5lite.interop.elmo.embed` and the analyses read."""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.data.elmo_chars import batch_char_ids
from t5lite.errors import ConfigError
from t5lite.infer import checkpoint_reader, predict
from t5lite.models.recurrent import BiLM, BiLMConfig


def _zero_states(cfg: BiLMConfig, batch: int):
    zeros = (jnp.zeros((batch, cfg.lstm_dim)), jnp.zeros((batch, cfg.projection_dim)))
    return [[zeros] * cfg.n_layers for _ in range(2)]


def embed(module: BiLM, variables: dict, sentences: Sequence[Sequence[str]], stateful: bool = False,
          batch_size: int = 32) -> list[np.ndarray]:
    """Per sentence, [n_layers + 1, tokens, 2 * projection_dim]: layer 0 the token vector twice,
    then each LSTM layer's forward and backward outputs; sentence boundaries removed. Sentences run
    in consecutive batches of `batch_size`; `stateful` carries the states between them."""
    apply = jax.jit(module.apply)
    states = _zero_states(module.config, batch_size)
    results = []
    for start in range(0, len(sentences), batch_size):
        chunk = sentences[start:start + batch_size]
        ids, lengths = batch_char_ids(chunk)
        # Pad the time axis to a multiple of 16 so that few shapes compile.
        ids = np.pad(ids, ((0, 0), (0, -ids.shape[1] % 16), (0, 0)))
        n = len(chunk)
        initial = jax.tree.map(lambda s: s[:n], states) if stateful else _zero_states(module.config, n)
        layers, final = apply(variables, ids, lengths, initial)
        if stateful:
            states = jax.tree.map(lambda old, new: old.at[:n].set(new), states, final)
        layers = np.asarray(layers)
        results.extend(layers[:, b, 1:len(s) + 1] for b, s in enumerate(chunk))
    return results


def load_run(checkpoint_path: str) -> tuple[BiLM, dict]:
    """(module, variables) of the biLM of a t5lite ELMo run (its latest checkpoint, or the step
    directory given): a run trained with `BiLMObjective` or imported with `t5lite convert --from_elmo`."""
    step_dir = checkpoint_reader.step_directory(checkpoint_path)
    config = predict.model_config_of(step_dir, None)
    if not isinstance(config, BiLMConfig):
        raise ConfigError(f"{checkpoint_path} is a {config.arch} run, not an ELMo biLM one; give a run trained with "
                          "BiLMObjective or imported with `t5lite convert --from_elmo`")
    abstract = jax.eval_shape(lambda: BiLM(config).init(jax.random.key(0), jnp.ones((1, 3, 50), jnp.int32),
                                                        jnp.ones((1,), jnp.int32)))
    params = checkpoint_reader.restore_params(step_dir, {"bilm": nn.unbox(abstract)["params"]})
    return BiLM(config), {"params": params["bilm"]}
