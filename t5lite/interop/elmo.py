"""The original ELMo files (TensorFlow bilm's options.json + weights hdf5, as allennlp publishes
them) as a t5lite `BiLM` and back, and contextual embeddings of whitespace-tokenised sentences.

    module, variables = load("options.json", "weights.hdf5")
    layers = embed(module, variables, [["The", "cat", "sat", "."]])   # [[3, 4, 1024]]

`embed` starts every sentence from zero LSTM states. `Embedder(module, variables)` is stateful as
the original TensorFlow bilm and allennlp's `Elmo` are: the states carry from one `embed_batch`
call to the next, row by row (row i of a batch starts where row i of the previous batch stopped),
until `reset_states()`.

`to_run` imports the files as a t5lite run directory (its biLM in `params["bilm"]`, what
`BiLMObjective` trains and the frozen-ELMo classifier grafts); `from_run` writes a trained run's
biLM back as the two files (the word softmax is not part of the format, as in bilm-tf's dump).
"""
from __future__ import annotations

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.data.elmo_chars import batch_char_ids
from t5lite.errors import CheckpointError, CheckpointNotFoundError, first_line
from t5lite.infer.elmo_layers import Embedder, embed, load_run
from t5lite.interop.checkpoint import _write_run
from t5lite.models.recurrent import BiLM, BiLMConfig, BiLMLanguageModel

__all__ = ["Embedder", "embed", "from_run", "load", "load_run", "save", "to_run"]

_LSTM_CELL = "RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


# bilm-tf's char CNN knows these two (bilm/model.py); any other name is not an ELMo file's.
_ACTIVATIONS = ("relu", "tanh")


def _read_options(options_json: str) -> BiLMConfig:
    """The options.json as a config, refused in one line when it is not bilm's JSON or misses a field."""
    try:
        with open(options_json, encoding="utf-8") as f:
            options = json.load(f)
    except UnicodeDecodeError:
        raise CheckpointError(f"{options_json} is not text (an hdf5?); pass the ELMo options.json as "
                              "--elmo_options and the weights hdf5 as --from_elmo") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{options_json}: line {e.lineno}: not valid JSON ({e.msg}); pass the "
                              "options.json released with the weights") from None
    try:
        cfg = BiLMConfig.from_options(options)
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"{options_json} is not a bilm options file: {first_line(e)}; it needs "
                              "`char_cnn` (filters, embedding.dim, n_characters, n_highway, activation) "
                              "and `lstm` (dim, projection_dim, n_layers)") from None
    if cfg.activation not in _ACTIVATIONS:
        raise CheckpointError(f"{options_json}: char_cnn.activation {cfg.activation!r} is not one of "
                              f"bilm's ({', '.join(_ACTIVATIONS)})")
    return cfg


def _param_shapes(cfg: BiLMConfig) -> dict[tuple[str, str], tuple[int, ...]]:
    """(scope, name) -> the shape a `BiLM` of `cfg` has for it (traced, nothing allocated)."""
    ids, lengths = batch_char_ids([["a"]])
    shapes = jax.eval_shape(BiLM(cfg).init, jax.random.PRNGKey(0), ids, lengths)
    return {(scope, name): tuple(leaf.shape) for scope, leaves in nn.unbox(shapes)["params"].items()
            for name, leaf in leaves.items()}


def _params_from_hdf5(fin, cfg: BiLMConfig, options_json: str) -> dict:
    """The bilm datasets as t5lite params, each checked against the shape the options give it."""
    chars = fin["char_embed"][...]
    # The file has no row for the padding id 0 that the +1 shift frees.
    params = {"char_cnn": {"char_embed": np.concatenate([np.zeros_like(chars[:1]), chars])}}
    for (scope, name), dataset in _hdf5_names(cfg).items():
        value = fin[dataset][...]
        params.setdefault(scope, {})[name] = value[0] if dataset.startswith("CNN/W_cnn") else value
    shapes = _param_shapes(cfg)
    for (scope, name), dataset in {("char_cnn", "char_embed"): "char_embed", **_hdf5_names(cfg)}.items():
        if params[scope][name].shape != shapes[scope, name]:
            raise CheckpointError(f"{fin.filename}: {dataset} does not match {options_json} ({scope}.{name} is "
                                  f"{params[scope][name].shape} here, {shapes[scope, name]} there); pass the "
                                  "options.json released with these weights")
    return jax.tree.map(jnp.asarray, params)


def load(options_json: str, weights_hdf5: str) -> tuple[BiLM, dict]:
    """(module, variables) from the original bilm files."""
    import h5py

    for path in (options_json, weights_hdf5):
        if not os.path.exists(path):
            raise CheckpointNotFoundError(f"{path}: no such file; pass the ELMo options.json and "
                                          "its weights hdf5")
    cfg = _read_options(options_json)
    try:
        with h5py.File(weights_hdf5, "r") as fin:
            params = _params_from_hdf5(fin, cfg, options_json)
    except (KeyError, OSError) as e:
        raise CheckpointError(f"{weights_hdf5}: not a bilm weights file matching {options_json} "
                              f"({e}); pass the hdf5 released with those options") from e
    return BiLM(cfg), {"params": params}


def save(module: BiLM, variables: dict, options_json: str, weights_hdf5: str) -> None:
    """Write the original bilm files (what `load` and allennlp's `Elmo` read)."""
    import h5py

    params = jax.tree.map(np.asarray, nn.unbox(variables)["params"])
    with open(options_json, "w") as f:
        json.dump(module.config.to_options(), f, indent=2)
    with h5py.File(weights_hdf5, "w") as fout:
        fout["char_embed"] = params["char_cnn"]["char_embed"][1:]
        for (scope, name), dataset in _hdf5_names(module.config).items():
            value = params[scope][name]
            fout[dataset] = value[None] if dataset.startswith("CNN/W_cnn") else value


def _hdf5_names(cfg: BiLMConfig) -> dict[tuple[str, ...], str]:
    """t5lite parameter path -> dataset name in the bilm file (char_embed aside)."""
    names = {}
    for k in range(len(cfg.filters)):
        names[("char_cnn", f"conv_{k}_kernel")] = f"CNN/W_cnn_{k}"
        names[("char_cnn", f"conv_{k}_bias")] = f"CNN/b_cnn_{k}"
    for k in range(cfg.n_highway):
        for part in ("carry", "transform"):
            names[("char_cnn", f"highway_{k}_{part}_kernel")] = f"CNN_high_{k}/W_{part}"
            names[("char_cnn", f"highway_{k}_{part}_bias")] = f"CNN_high_{k}/b_{part}"
    names[("char_cnn", "proj_kernel")] = "CNN_proj/W_proj"
    names[("char_cnn", "proj_bias")] = "CNN_proj/b_proj"
    for d, direction in enumerate(("forward", "backward")):
        for layer in range(cfg.n_layers):
            cell = _LSTM_CELL.format(d=d, layer=layer)
            for ours, theirs in (("kernel", "W_0"), ("bias", "B"), ("proj", "W_P_0")):
                names[(f"{direction}_{layer}", ours)] = f"{cell}/{theirs}"
    return names


def to_run(options_json: str, weights_hdf5: str, out_dir: str, vocab_size: int = 0) -> BiLMConfig:
    """Writes the bilm files as a t5lite run (step 0). With `vocab_size` > 0 it gets a zero word
    softmax of that size, so `BiLMObjective` can continue pre-training it."""
    module, variables = load(options_json, weights_hdf5)
    config = module.config.replace(vocab_size=vocab_size)
    params = {"bilm": variables["params"]}
    if vocab_size:
        params["softmax_kernel"] = jnp.zeros((config.projection_dim, vocab_size))
        params["softmax_bias"] = jnp.zeros((vocab_size,))
    _write_run(BiLMLanguageModel(config), {"params": params}, out_dir, {"converted_from": os.path.abspath(weights_hdf5)})
    return config


def from_run(run_dir: str, options_json: str, weights_hdf5: str) -> BiLMConfig:
    """Writes the biLM of a t5lite ELMo run (its latest checkpoint, or the given step) as the bilm files."""
    module, variables = load_run(run_dir)
    save(module, variables, options_json, weights_hdf5)
    return module.config
