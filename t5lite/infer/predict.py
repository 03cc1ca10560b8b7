"""Loading a checkpoint for inference, and decoding free text with it (`t5lite infer`).

Every family with a decoder: an encoder-decoder reads each text as encoder tokens ending in EOS;
a decoder-only model continues it as a prompt (no EOS; a long prompt loses its start, not its
end). Each prediction comes with its score, the total log-likelihood of its tokens
(`scoring.target_log_likelihood`), whichever method chose them.

Given a `Partitioner`, parameters are laid out by their logical axes (heads and MLP over
`model`, ...) and each batch over `data`; decoding is then one jitted program over the mesh
and gives the same tokens as one device.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
from typing import Any, Iterator, Mapping, Sequence

import flax.linen as nn
from flax.traverse_util import flatten_dict, unflatten_dict
import gin
import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from tqdm.auto import tqdm

from t5lite import finite, models
from t5lite.data import vocab as vocab_lib
from t5lite.errors import CheckpointError, ConfigError, require_positive
from t5lite.infer import checkpoint_reader, decoding, peft_checkpoint, scoring
from t5lite.models import vision
from t5lite.models.config import ModelConfig, config_changes, json_tuples, load_config
from t5lite.run_layout import RunDir

log = logging.getLogger(__name__)

METHODS = ("greedy", "beam", "sample")
SHOWN = 5     # input indices a warning lists before "..."


# Fields a run's saved config keeps over a gin model: what `t5lite convert --quantize` made of it, and
# the attention it was trained with (a training gin's overrides add a window that the config file lacks).
KEPT_FROM_RUN = {"weight_quantization": "none", "attention_window": None, "attention_dilation": 1,
                 "max_global_tokens": 16}


# Fields a gin model may set otherwise than the run it reads: how the model runs, not what the trained
# weights compute (dropout is off in evaluation, the initialisation is replaced by the checkpoint).
RUN_TIME_FIELDS = frozenset({"dropout_rate", "mlp_dropout", "init_std", "dtype", "attention_impl", "scan_layers",
                             "remat_policy"})


def model_config_of(checkpoint_path: str, model: ModelConfig | None) -> ModelConfig:
    """`model` when gin gives one, else the run's saved `model_config.json` (t5lite runs and
    Hugging Face models imported with `t5lite convert --from_hf` have one). A gin model keeps the
    run's KEPT_FROM_RUN fields: a quantised run (`t5lite convert --quantize`) is evaluated by its
    training gin as the int8 model it is, and a windowed (Longformer) run with its window; any other
    field it sets otherwise than the run (RUN_TIME_FIELDS aside) is refused in one line, since the
    weights would be read by another model than the one that learned them."""
    path = RunDir.of_step(checkpoint_reader.step_directory(checkpoint_path)).model_config
    exists = path.exists()
    if model is not None:
        if not (exists and hasattr(model, "weight_quantization")):   # Transformer configs (not recurrent ones)
            return model
        model = model.replace(**_saved_fields(path))
        _check_same_model(checkpoint_path, path, model)
        return model
    if not exists:
        raise CheckpointError(f"{checkpoint_path}: no {path.name} in its run directory and no model in gin; "
                              "include the model's gin file, e.g. --gin_file=gin/models/t5_tiny.gin")
    return load_config(path)


def _check_same_model(checkpoint_path: str, path, model: ModelConfig) -> None:
    """Refuses a gin model that differs from the run's saved config in what the weights compute (a
    layer norm's epsilon, an activation, a position table: a training-time override the command
    left out); a saved config that cannot be read is left to the restore to report."""
    try:
        saved = load_config(path)
    except CheckpointError:
        return
    differs = [(name, trained, given) for name, (trained, given) in config_changes(saved, model).items()
               if name not in RUN_TIME_FIELDS]
    if differs:
        name, trained, given = differs[0]
        more = f" (and {', '.join(n for n, _, _ in differs[1:])})" if differs[1:] else ""
        overrides = "{" + ", ".join(f"'{n}': {t!r}" for n, t, _ in differs) + "}"
        raise ConfigError(f"{checkpoint_path} was trained with model_config {name}={trained!r}, and the gin model has "
                          f"{given!r}{more}: leave the model out of gin to read the run's {path.name}, or add "
                          f"--gin.model_config.overrides=\"{overrides}\"")


def _saved_fields(path: str) -> dict:
    """The KEPT_FROM_RUN fields a saved model config records (their defaults where it records none, as
    a gin model ignores the rest of the file)."""
    try:
        saved = json.loads(epath.Path(path).read_text(encoding="utf-8"))
    except ValueError:
        saved = {}
    saved = saved if isinstance(saved, dict) else {}
    return {name: json_tuples(saved.get(name, default)) for name, default in KEPT_FROM_RUN.items()}


def abstract_variables(config: ModelConfig, module=None) -> dict:
    """Shapes of the variables of `module` (default: `build(config)`; a backbone with a task head,
    say), boxed with their logical axis names."""
    module = models.build(config) if module is None else module
    names = {"encoder": ["encoder_input_tokens"], "decoder": ["decoder_input_tokens"],
             "encoder_decoder": ["encoder_input_tokens", "decoder_input_tokens"],
             "awd_lstm": ["encoder_input_tokens"]}[config.arch]   # word ids (ULMFiT's language model)

    def init():   # everything inside eval_shape: the mesh may be a TPU topology's (t5lite compile)
        return module.init(jax.random.key(0), **{name: jnp.ones((1, 8), jnp.int32) for name in names},
                           **vision.init_features(config))   # and a ViT's images
    return jax.eval_shape(init)


def abstract_params(config: ModelConfig, partitioner=None, module=None) -> dict:
    """Shapes of the parameters, laid out as `partitioner` shards them (else on the first device)."""
    boxed = abstract_variables(config, module)
    if partitioner is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda _: device, nn.unbox(boxed))["params"]
    else:
        shardings = partitioner.param_shardings(boxed)["params"]
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        nn.unbox(boxed)["params"], shardings)


def _shardings_of(params, abstract, partitioner):
    """The model's shardings for `params`; a leaf the model does not create (a prompt-tuning
    prompt, read when present) is replicated."""
    shardings = flatten_dict(jax.tree.map(lambda x: x.sharding, abstract))
    return unflatten_dict({p: shardings.get(p, partitioner.sharding(None)) for p in flatten_dict(params)})


def load_params(config: ModelConfig, checkpoint_path: str, partitioner=None, vocabulary=None, module=None,
                objective=None):
    """(params, step, step directory) of a t5lite checkpoint for the model `config` (trained as
    `module`, default `build(config)`); refused if the run recorded another vocabulary than
    `vocabulary` (default: the one the tasks use), or with more ids than the embedding the run's
    training `objective` reads has rows (a word-level model reads none of them)."""
    step_dir = checkpoint_reader.step_directory(checkpoint_path)
    run = str(RunDir.of_step(step_dir))
    rows = config.vocab_size if objective is None else objective.embedding_rows(config)
    vocab_lib.check_identity(run, vocabulary or vocab_lib.DEFAULT_VOCABULARY, rows)
    abstract = abstract_params(config, partitioner, module)
    record = peft_checkpoint.read(run)
    if record is not None:   # a PEFT run: its base with the trained parameters applied
        params = peft_checkpoint.restore_merged(step_dir, run, record, abstract)
    else:
        params = checkpoint_reader.restore_params(step_dir, abstract)
    name = os.path.basename(step_dir)
    return params, int(name) if name.isdigit() else None, step_dir


def detokenize(vocabulary, ids) -> str:
    """Ids to text. The embedding is padded past the vocabulary (2100 -> 2176 rows), and a model
    may emit those ids; they become UNK rather than an error."""
    ids = np.asarray(ids)
    unk = getattr(vocabulary, "unk_id", vocab_lib.UNK_ID)
    return vocabulary.decode(np.where(ids < vocabulary.vocab_size, ids, unk).tolist())


def until_eos(ids, eos_id: int) -> np.ndarray:
    """A decoded row without its EOS and what follows (the model's EOS, which may not be the
    vocabulary's)."""
    ids = np.asarray(ids)
    ends = np.flatnonzero(ids == eos_id)
    return ids[:ends[0]] if len(ends) else ids


def decoded_lengths(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """[batch] tokens of each row up to and including its first EOS (all of them if none)."""
    is_eos = tokens == eos_id
    return np.where(is_eos.any(axis=1), is_eos.argmax(axis=1) + 1, tokens.shape[1]).astype(np.int32)


def listed(indices: Sequence[int]) -> str:
    """The first `SHOWN` input indices, then "..." if there are more."""
    return ", ".join(map(str, indices[:SHOWN])) + (", ..." if len(indices) > SHOWN else "")


def warn_truncated(logger: logging.Logger, cut: Sequence[int], total: int, limit: str, kept: str, fix: str) -> None:
    """One warning for all the inputs a command cut to its length `limit` (how many, and the first
    indices), not one per input: a result on a text's start is not one on the whole text."""
    if cut:
        logger.warning("%d of %d inputs are longer than %s: truncated to their %s (input %s); %s", len(cut), total,
                       limit, kept, listed(cut), fix)


def fitted_ids(vocabulary, texts: Sequence[str], max_length: int, *, append_eos: bool = True) -> list[list[int]]:
    """Each text's token ids, at most `max_length`: with `append_eos` (an encoder's input) a text is
    EOS-terminated and a long one keeps its first tokens; without (a prompt to continue) its last
    ones. The cuts are warned about once (`warn_truncated`)."""
    eos = getattr(vocabulary, "eos_id", vocab_lib.EOS_ID)
    rows, cut = [], []
    for index, text in enumerate(texts):
        ids = list(vocabulary.encode(text)) + ([eos] if append_eos else [])
        if len(ids) > max_length:
            cut.append(index)
            ids = ids[:max_length - 1] + [eos] if append_eos else ids[len(ids) - max_length:]
        rows.append(ids)
    counted = " (with EOS)" if append_eos else ""
    warn_truncated(log, cut, len(texts), f"infer.max_input_length={max_length} tokens{counted}",
                   f"{'first' if append_eos else 'last'} {max_length} tokens",
                   "raise infer.max_input_length to decode more of them")
    return rows


def encode_texts(vocabulary, texts: Sequence[str], max_length: int, *, append_eos: bool = True, pad_id: int = 0,
                 multiple: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """The texts' `fitted_ids`, padded (`padded_ids`)."""
    return padded_ids(fitted_ids(vocabulary, texts, max_length, append_eos=append_eos), max_length, pad_id, multiple)


def padded_ids(rows: Sequence[Sequence[int]], max_length: int, pad_id: int = 0,
               multiple: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """([n, width] token rows padded with `pad_id`, [n] lengths); width rounds up to `multiple`
    so similar inputs share a compile."""
    width = max(1, min(max_length, -(-max(map(len, rows)) // multiple) * multiple))
    out = np.full((len(rows), width), pad_id, np.int32)
    for out_row, ids in zip(out, rows):
        out_row[:len(ids)] = ids
    return out, np.array([len(ids) for ids in rows], np.int32)


def fill_batch(batch: Mapping[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """A short batch padded to `size` rows by repeating its last row (one compiled shape; copies
    of a real row also end when it does, so they never keep the decode loop running)."""
    rows = len(next(iter(batch.values())))
    return {k: np.concatenate([v, np.repeat(v[-1:], size - rows, axis=0)]) for k, v in batch.items()}


def check_method(method: str, beam_rules: str = "t5x", repetition_penalty: float = 1.0) -> None:
    if method not in METHODS:
        raise ConfigError(f"infer.method must be greedy, beam or sample; got {method!r}")
    if not repetition_penalty > 0:
        raise ConfigError(f"infer.repetition_penalty must be positive (CTRL's is 1.2; 1.0 is off); got {repetition_penalty}")
    if method == "beam" and repetition_penalty != 1.0:
        raise ConfigError(f"infer.repetition_penalty={repetition_penalty} applies to greedy and sample decoding, not beam "
                          "search; use infer.method = 'greedy' or 'sample', or leave the penalty at 1.0")
    if beam_rules not in decoding.BEAM_RULES:
        raise ConfigError(f"infer.beam_rules must be 't5x' (T5X's beam search) or 'hf' (Hugging Face's); "
                          f"got {beam_rules!r}")


def _best_tokens(module, params, inputs, rng, *, method: str, max_decode_length: int, num_beams: int, alpha: float,
                 beam_rules: str, temperature: float, top_k: int, top_p: float, repetition_penalty: float) -> jax.Array:
    """[batch, max_decode_length]: the tokens `method` ranks first."""
    if method == "greedy":
        return decoding.greedy(module, params, inputs, max_decode_length=max_decode_length,
                               repetition_penalty=repetition_penalty).tokens
    if method == "beam":
        return decoding.beam_search(module, params, inputs, max_decode_length=max_decode_length,
                                    num_beams=num_beams, alpha=alpha, rules=beam_rules).tokens[:, 0]
    return decoding.temperature_sample(module, params, inputs, rng, max_decode_length=max_decode_length,
                                       temperature=temperature, top_k=top_k, top_p=top_p,
                                       repetition_penalty=repetition_penalty).tokens[:, 0]


class Predictor:
    """A model and its parameters, optionally laid out on a mesh, decoding and scoring batches.

    With a `partitioner`, the parameters take their logical shardings and each batch is split
    over the data axes; decoding is jitted with those input and output shardings. A batch whose
    size does not divide by the data-parallel size is filled with copies of its last row."""

    def __init__(self, module, params, partitioner=None, *, method: str = "greedy", max_decode_length: int = 64,
                 num_beams: int = 4, alpha: float = 0.6, beam_rules: str = "t5x", temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 0.0, repetition_penalty: float = 1.0):
        check_method(method, beam_rules, repetition_penalty)
        self.module, self.partitioner = module, partitioner
        decode = functools.partial(_best_tokens, module, method=method, max_decode_length=max_decode_length,
                                   num_beams=num_beams, alpha=alpha, beam_rules=beam_rules, temperature=temperature,
                                   top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty)
        score = functools.partial(scoring.target_log_likelihood, module)
        if partitioner is None:
            self.params, self.rows = params, 1
            self._decode, self._score = decode, score
            return
        param_shardings = _shardings_of(params, abstract_params(module.config, partitioner), partitioner)
        self.params = jax.device_put(params, param_shardings)
        batch, replicated = partitioner.batch_sharding(1), partitioner.sharding(None)
        self.rows = partitioner.data_parallel_size
        self._decode = jax.jit(decode, in_shardings=(param_shardings, batch, replicated), out_shardings=batch)
        self._score = jax.jit(score, in_shardings=(param_shardings, batch, batch, batch), out_shardings=batch)

    def _context(self):
        return self.partitioner.context() if self.partitioner is not None else contextlib.nullcontext()

    def __call__(self, inputs: Mapping[str, np.ndarray], rng=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens [batch, max_decode_length] with the pad id after EOS, lengths [batch] counting
        EOS, scores [batch]: summed log-likelihood of those tokens)."""
        batch = len(next(iter(inputs.values())))
        inputs = fill_batch(inputs, -(-batch // self.rows) * self.rows)
        rng = jax.random.key(0) if rng is None else rng
        with self._context():
            tokens = np.asarray(self._decode(self.params, inputs, rng))
            lengths = decoded_lengths(tokens, self.module.config.eos_token_id)
            scores = np.asarray(self._score(self.params, inputs, tokens, lengths))
        return tokens[:batch], lengths[:batch], scores[:batch]


def reads_encoder_inputs(config: ModelConfig) -> bool:
    """Whether the model reads a text as encoder input (an encoder-decoder) rather than as a prompt
    to continue (decoder-only); an encoder, which generates nothing, is refused."""
    if config.arch == "encoder":
        raise ConfigError("t5lite infer generates text: it needs a model with a decoder (decoder-only or "
                          "encoder-decoder), not an encoder")
    return config.arch == "encoder_decoder"


def prompt_features(config: ModelConfig, rows: Sequence[Sequence[int]], max_length: int) -> dict[str, np.ndarray]:
    """Token rows (`fitted_ids`) as the family's inputs: encoder tokens, or prompts with their lengths."""
    tokens, lengths = padded_ids(rows, max_length, pad_id=config.pad_token_id)
    if reads_encoder_inputs(config):
        return {"encoder_input_tokens": tokens}
    return {"decoder_prompt_tokens": tokens, "decoder_prompt_lengths": lengths}


@gin.configurable("infer", denylist=["inputs", "progress"])
def infer(inputs: Sequence[str], checkpoint_path: str = gin.REQUIRED, model: ModelConfig | None = None,
          method: str = "greedy", max_input_length: int = 512, max_decode_length: int = 64, num_beams: int = 4,
          alpha: float = 0.6, beam_rules: str = "t5x", temperature: float = 1.0, top_k: int = 0, top_p: float = 0.0,
          repetition_penalty: float = 1.0, seed: int = 0, batch_size: int = 16, vocabulary_path: str | None = None, vocabulary: Any = None,
          partitioner=None, progress: bool = True) -> Iterator[dict]:
    """Decodes each text with `method` ("greedy", "beam" with `num_beams`, T5X's brevity penalty
    `alpha` and the search of `beam_rules`: "t5x" or "hf", see `decoding.beam_search`; or "sample"
    with `temperature`, `top_k`, `top_p`; greedy and sample take CTRL's `repetition_penalty`, 1.0 off,
    see `decoding.penalize_repetition`); yields one record per text, in order:
    {"input", "prediction", "score", "tokens"}.

    `model` defaults to the run's saved config; `vocabulary` (an object with encode / decode)
    to the vocabulary file at `vocabulary_path` (any kind), else the run's own tokenizer (a converted
    Hugging Face model's), else the built-in tasks' vocabulary."""
    check_method(method, beam_rules, repetition_penalty)
    checkpoint_reader.require_command_takes(checkpoint_path, "infer")
    require_positive({"infer.max_input_length": max_input_length, "infer.max_decode_length": max_decode_length,
                      "infer.batch_size": batch_size, **({"infer.num_beams": num_beams} if method == "beam" else {})})
    if vocabulary is None:
        run = RunDir.of_step(checkpoint_reader.step_directory(checkpoint_path))
        vocab_lib.use_run_vocabulary(vocabulary_path, str(run))
        vocabulary = vocab_lib.DEFAULT_VOCABULARY
    config = model_config_of(checkpoint_path, model)
    if config.image_size:
        raise ConfigError(f"{checkpoint_path} is an image model (image_size={config.image_size}) and `t5lite infer` "
                          "reads texts; decode images from Python with t5lite.infer.decoding.greedy on "
                          "encoder_input_images (docs/guides/vision.md)")
    module = models.build(config)
    params, _, step_dir = load_params(config, checkpoint_path, partitioner, vocabulary)
    predictor = Predictor(module, params, partitioner, method=method, max_decode_length=max_decode_length,
                          num_beams=num_beams, alpha=alpha, beam_rules=beam_rules, temperature=temperature,
                          top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty)
    return _records(predictor, vocabulary, list(inputs), max_input_length, batch_size, seed, progress, step_dir)


def _records(predictor: Predictor, vocabulary, texts: list[str], max_input_length: int, batch_size: int, seed: int,
             progress: bool, checkpoint: str) -> Iterator[dict]:
    """One record per text; a batch whose scores are not finite stops them, naming `checkpoint`."""
    config = predictor.module.config
    rows = fitted_ids(vocabulary, texts, max_input_length, append_eos=reads_encoder_inputs(config))
    rng = jax.random.key(seed)
    with tqdm(total=len(texts), desc="infer", unit="input", disable=not progress) as bar:
        for start in range(0, len(texts), batch_size):
            chunk = texts[start:start + batch_size]
            features = prompt_features(config, rows[start:start + batch_size], max_input_length)
            rng, key = jax.random.split(rng)
            tokens, lengths, scores = predictor(features, key)
            finite.require_finite(scores, "scores", checkpoint)
            for text, ids, n, score in zip(chunk, tokens, lengths, scores):
                yield {"input": text, "prediction": detokenize(vocabulary, until_eos(ids[:n], config.eos_token_id)),
                       "score": float(score), "tokens": int(n)}
            bar.update(len(chunk))
