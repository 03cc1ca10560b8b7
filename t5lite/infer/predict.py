"""Loading a trained model for inference, and decoding free text with it (`t5lite infer`)."""
from __future__ import annotations

import logging
import os
from typing import Sequence

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from t5lite import models
from t5lite.data import vocab as vocab_lib
from t5lite.errors import ConfigError
from t5lite.infer import decoding
from t5lite.train import checkpoints

log = logging.getLogger(__name__)


def run_dir(step_dir: str) -> str:
    """The run directory a step directory belongs to (`<run>/checkpoints/<step>` -> `<run>`)."""
    parent = os.path.dirname(os.path.abspath(step_dir))
    return os.path.dirname(parent) if os.path.basename(parent) == "checkpoints" else parent


def abstract_params(config) -> dict:
    """Shapes of the model's parameters, laid out on the first device (what inference restores into)."""
    module = models.build(config)
    tokens = jnp.ones((1, 8), jnp.int32)
    features = {"encoder": {"encoder_input_tokens": tokens}, "decoder": {"decoder_input_tokens": tokens},
                "encoder_decoder": {"encoder_input_tokens": tokens, "decoder_input_tokens": tokens}}[config.arch]
    shapes = nn.unbox(jax.eval_shape(lambda: module.init(jax.random.key(0), **features)))["params"]
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), shapes)


def load_params(config, checkpoint_path: str):
    """(params, step, step directory) of a t5lite checkpoint for the model `config`; refused if the
    run recorded another vocabulary than the one in use."""
    step_dir = checkpoints.step_directory(checkpoint_path)
    vocab_lib.check_identity(run_dir(step_dir), vocab_lib.DEFAULT_VOCABULARY, config.vocab_size)
    params = checkpoints.restore_params(step_dir, abstract_params(config))
    name = os.path.basename(step_dir)
    return params, int(name) if name.isdigit() else None, step_dir


def detokenize(vocabulary, ids) -> str:
    """Ids to text. The embedding is padded past the vocabulary (2100 -> 2176 rows), and a model
    may emit those ids; they become UNK rather than an error."""
    ids = np.asarray(ids)
    return vocabulary.decode(np.where(ids < vocabulary.vocab_size, ids, vocab_lib.UNK_ID).tolist())


def encode_texts(vocabulary, texts: Sequence[str], max_length: int, multiple: int = 16,
                 first_index: int = 0) -> np.ndarray:
    """[n, width] EOS-terminated token rows, 0-padded; width rounds up so similar inputs share a compile.

    An input longer than `max_length` tokens (EOS included) is cut, with a warning naming its index
    (counted from `first_index`) and both lengths: the model never sees the rest."""
    rows = []
    for index, text in enumerate(texts, first_index):
        ids = vocabulary.encode(text)
        if len(ids) + 1 > max_length:
            log.warning("input %d is %d tokens (with EOS), longer than infer.max_input_length=%d: truncated to "
                        "its first %d tokens", index, len(ids) + 1, max_length, max_length)
        rows.append(ids[:max_length - 1] + [vocab_lib.EOS_ID])
    width = min(max_length, -(-max(map(len, rows)) // multiple) * multiple)
    out = np.zeros((len(rows), width), np.int32)
    for out_row, ids in zip(out, rows):
        out_row[:len(ids)] = ids
    return out


@gin.configurable("infer", denylist=["inputs"])
def infer(inputs: Sequence[str], checkpoint_path: str = gin.REQUIRED, model=gin.REQUIRED, method: str = "greedy",
          max_input_length: int = 512, max_decode_length: int = 64, num_beams: int = 4, temperature: float = 1.0,
          top_k: int = 0, top_p: float = 0.0, seed: int = 0, batch_size: int = 16,
          vocabulary_path: str | None = None) -> list[str]:
    """Decodes each input text with `method` "greedy", "beam" or "sample" (encoder-decoders)."""
    if method not in ("greedy", "beam", "sample"):
        raise ConfigError(f"infer.method must be greedy, beam or sample; got {method!r}")
    if vocabulary_path is not None:
        vocab_lib.set_default_vocabulary(vocabulary_path)
    vocabulary = vocab_lib.DEFAULT_VOCABULARY
    module = models.build(model)
    params, _, _ = load_params(model, checkpoint_path)
    outputs, rng = [], jax.random.key(seed)
    for start in range(0, len(inputs), batch_size):
        tokens = {"encoder_input_tokens": encode_texts(vocabulary, inputs[start:start + batch_size], max_input_length,
                                                       first_index=start)}
        if method == "greedy":
            decoded = decoding.greedy(module, params, tokens, max_decode_length=max_decode_length).tokens
        elif method == "beam":
            decoded = decoding.beam_search(module, params, tokens, max_decode_length=max_decode_length,
                                           num_beams=num_beams).tokens[:, 0]
        else:
            rng, key = jax.random.split(rng)
            decoded = decoding.temperature_sample(module, params, tokens, key, max_decode_length=max_decode_length,
                                                  temperature=temperature, top_k=top_k, top_p=top_p).tokens[:, 0]
        outputs.extend(detokenize(vocabulary, ids) for ids in np.asarray(decoded))
    return outputs
