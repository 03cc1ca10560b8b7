"""ELMo's layer outputs for whitespace-tokenised sentences, from a biLM's variables (the original
files through `t5lite.interop.elmo.load`) or a t5lite ELMo run (`load_run`): what `t5lite embed`,
`t5lite.interop.elmo.embed` / `Embedder` and the analyses read."""
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


# One compiled function per biLM config and shape, shared by every Embedder.
_apply = jax.jit(lambda module, variables, ids, lengths, initial: module.apply(variables, ids, lengths, initial),
                 static_argnums=0)


class Embedder:
    """ELMo's layers, one batch of sentences per `embed_batch` call. Stateful by default, as
    bilm-tf's BidirectionalLanguageModel (bilm/model.py, `_build_lstms`) and allennlp's `Elmo` and
    `ElmoEmbedder` are (the released biLMs were trained that way): each LSTM keeps its state per
    batch row across calls, so row i of a call starts where row i of the last call that had a row i
    stopped (after its `</S>`); the first call and rows never used start from zeros. `reset_states`
    zeroes them; `stateful=False` starts every call from zeros."""

    def __init__(self, module: BiLM, variables: dict, stateful: bool = True):
        self.module, self.variables, self.stateful = module, variables, stateful
        self._states = None  # [direction][layer] = (c, h), each [rows so far, dim]

    def reset_states(self, rows: Sequence[int] | None = None) -> None:
        """Zero the states of the given batch rows (allennlp's `reset_states(mask)`), or all of them."""
        if rows is None or self._states is None:
            self._states = None
        else:
            rows = np.asarray(rows, np.int32)
            self._states = jax.tree.map(lambda s: s.at[rows].set(0.0), self._states)

    def embed_batch(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Per sentence, [n_layers + 1, tokens, 2 * projection_dim]: layer 0 the token vector twice,
        then each LSTM layer's forward and backward outputs; sentence boundaries removed."""
        n = len(sentences)
        if not n:
            return []
        ids, lengths = batch_char_ids(sentences)
        # Pad the time axis to a multiple of 16 so that few shapes compile.
        ids = np.pad(ids, ((0, 0), (0, -ids.shape[1] % 16), (0, 0)))
        initial = _zero_states(self.module.config, n)
        if self.stateful:
            if self._states is not None:
                # Rows beyond the kept ones are new and start from zeros (allennlp grows its states
                # so; bilm-tf's are zeros up to max_batch_size).
                grow = lambda s: jnp.pad(s, ((0, max(n - s.shape[0], 0)), (0, 0)))
                self._states = jax.tree.map(grow, self._states)
                initial = jax.tree.map(lambda s: s[:n], self._states)
            else:
                self._states = initial
        layers, final = _apply(self.module, self.variables, ids, lengths, initial)
        if self.stateful:
            # bilm-tf: concat([final[:batch_size], init[batch_size:]]): later rows keep theirs.
            self._states = jax.tree.map(lambda old, new: old.at[:n].set(new), self._states, final)
        layers = np.asarray(layers)
        return [layers[:, b, 1:len(s) + 1] for b, s in enumerate(sentences)]

    def embed_sentences(self, sentences: Sequence[Sequence[str]], batch_size: int = 32) -> list[np.ndarray]:
        """`embed_batch` over consecutive batches of `batch_size` sentences (allennlp's
        `ElmoEmbedder.embed_sentences`)."""
        return [layer for start in range(0, len(sentences), batch_size)
                for layer in self.embed_batch(sentences[start:start + batch_size])]


def embed(module: BiLM, variables: dict, sentences: Sequence[Sequence[str]], batch_size: int = 32) -> list[np.ndarray]:
    """`Embedder.embed_batch`'s layers for each sentence, every sentence from zero states (unlike
    allennlp's stateful `ElmoEmbedder.embed_sentences`): a sentence's vectors do not depend on the
    sentences before it or on the batching, and a biLM trained by t5lite saw each row from zero
    states. `Embedder` gives the original's stateful use."""
    return Embedder(module, variables, stateful=False).embed_sentences(sentences, batch_size)


def load_run(checkpoint_path: str) -> tuple[BiLM, dict]:
    """(module, variables) of the biLM of a t5lite ELMo run (its latest checkpoint, or the step
    directory given): a run trained with `BiLMObjective` or imported with `t5lite convert --from_elmo`."""
    step_dir = checkpoint_reader.step_directory(checkpoint_path)
    config = predict.model_config_of(step_dir, None)
    if not isinstance(config, BiLMConfig):
        raise ConfigError(f"{checkpoint_path} is a {config.arch} run, not an ELMo biLM one; give a run trained with "
                          "BiLMObjective or imported with `t5lite convert --from_elmo`")
    abstract = jax.eval_shape(lambda: initial_variables(config))
    params = checkpoint_reader.restore_params(step_dir, {"bilm": abstract["params"]})
    return BiLM(config), {"params": params["bilm"]}


def initial_variables(config: BiLMConfig, seed: int = 0) -> dict:
    """A freshly initialised biLM's variables (the probes' untrained control)."""
    variables = BiLM(config).init(jax.random.key(seed), jnp.ones((1, 3, 50), jnp.int32), jnp.ones((1,), jnp.int32))
    return {"params": nn.unbox(variables)["params"]}
