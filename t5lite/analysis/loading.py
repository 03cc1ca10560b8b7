"""The model an analysis looks into: a Hugging Face folder or a t5lite run, frozen, with its
vocabulary, laid out so every layer can be read (looped layers, no remat, attention probabilities
materialised), and the same shape freshly initialised as the control. The probes also read ELMo
runs and static word vectors (a word2vec run, a word2vec or GloVe file): the feature-based
baselines the contextual models are compared with.
"""
from __future__ import annotations

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from t5lite import models
from t5lite.data import vocab as vocab_lib
from t5lite.data.word_vectors import WordVectors, load_word_vectors
from t5lite.errors import ConfigError, DataNotFoundError
from t5lite.run_layout import RunDir

# What reading the layers needs; none of these changes a parameter's shape or an output.
READABLE = dict(scan_layers=False, remat_policy="none", attention_impl="einsum", dropout_rate=0.0)


@dataclasses.dataclass(frozen=True)
class Subject:
    """A frozen model: `module.apply(variables, ...)`, the vocabulary its inputs are written in; or
    static `word_vectors` (module None): one vector per word, whatever its context."""
    module: nn.Module | None
    variables: dict
    vocabulary: object
    name: str
    checkpoint: str | None = None   # where the parameters come from: a step directory, a Hugging Face folder, a file
    word_vectors: WordVectors | None = None


def _is_hf_folder(path: str) -> bool:
    return (epath.Path(path) / "config.json").is_file()


def _vocabulary(path: str | None, folder: str | None):
    """`path` (--vocabulary) when given, else the tokenizer found in `folder`, else None."""
    path = path or (vocab_lib.tokenizer_file(folder) if folder else None)
    return None if path is None else vocab_lib.make_vocabulary(vocab_lib.kind_of_file(path), path)


def load(path: str, vocabulary: str | None = None, name: str | None = None, command: str = "probe") -> Subject:
    """A Hugging Face model folder (config.json + weights, its tokenizer beside them) or a t5lite
    run / checkpoint directory (its recorded tokenizer, `--vocabulary`, or the default one); of a
    fine-tuned run, the backbone without its task head; of an ELECTRA run (t5lite.objectives.electra),
    the discriminator; of an ELMo run (pre-trained or converted with `t5lite convert --from_elmo`),
    the biLM; for `t5lite probe`, also static word vectors: a word2vec or GloVe file, or a word2vec
    run's exported vectors.
    `name` labels the results (default: the folder's name); a run `t5lite COMMAND` cannot read
    (`checkpoint_reader.require_command_takes`) is refused before any work."""
    from t5lite.infer import checkpoint_reader, elmo_layers, predict
    from t5lite.interop import hf
    if not epath.Path(path).exists():
        raise DataNotFoundError(f"--model {path!r} does not exist; give a Hugging Face model folder or a t5lite run")
    if epath.Path(path).is_file():
        if command != "probe":
            raise ConfigError(f"--model {path} is a file; `t5lite {command}` reads a Hugging Face model folder or a "
                              "t5lite run (`t5lite probe` also reads a word2vec or GloVe file)")
        return _static(load_word_vectors(path), name or os.path.basename(path), path)
    if _is_hf_folder(path):
        module, variables = hf.load(path, **READABLE)
        vocab = _vocabulary(vocabulary, path)
        if vocab is None:
            raise ConfigError(f"--model {path}: the folder has no tokenizer t5lite reads; pass --vocabulary FILE")
        return Subject(module, variables, vocab, name or os.path.basename(os.path.normpath(path)), path)
    checkpoint_reader.require_command_takes(path, command)
    config = predict.model_config_of(path, None)
    step_dir = checkpoint_reader.step_directory(path)
    run = str(RunDir.of_step(step_dir))
    name = name or os.path.basename(os.path.normpath(run))
    if config.arch == "bilm":     # ELMo reads characters: no vocabulary
        module, variables = elmo_layers.load_run(path)
        return Subject(module, variables, None, name, step_dir)
    if config.arch == "word2vec":
        vectors = RunDir(run).word_vectors
        if not vectors.exists():
            raise DataNotFoundError(f"{vectors} does not exist (a word2vec run writes it at its last step); write it "
                                    "from the latest checkpoint with t5lite.objectives.word2vec.export_vectors(run_dir)")
        return _static(load_word_vectors(vectors), name, str(vectors))
    vocab = _vocabulary(vocabulary, str(RunDir(run).tokenizer)) or vocab_lib.DEFAULT_VOCABULARY
    # Fine-tuned: the backbone, not the head. ELECTRA: the discriminator (the run's model), not the generator.
    if checkpoint_reader.stored_param_names(step_dir) & {"backbone", "discriminator"}:
        vocab_lib.check_identity(run, vocab, config.vocab_size)
        params = checkpoint_reader.restore_model(step_dir, predict.abstract_params(config))
    else:
        params, _, _ = predict.load_params(config, path, vocabulary=vocab)
    if config.scan_layers:
        params = models.unscan_params(params)
    return Subject(models.build(config.replace(**READABLE)), {"params": params}, vocab_lib.resolved(vocab), name,
                   step_dir)


def _static(vectors: WordVectors, name: str, source: str) -> Subject:
    return Subject(None, {}, None, name, source, word_vectors=vectors)


def untrained(subject: Subject, seed: int = 0) -> Subject:
    """The control: the same configuration with freshly initialised parameters; of static vectors,
    normal random ones of the table's spread for the same words (a probe on them reads word
    identity alone)."""
    from t5lite.infer import elmo_layers
    untrained_name = dict(name=f"{subject.name} (untrained)", checkpoint=None)
    if subject.word_vectors is not None:
        table = subject.word_vectors.vectors
        random = np.random.default_rng(seed).normal(0.0, float(table.std()), table.shape).astype(table.dtype)
        return dataclasses.replace(subject, word_vectors=WordVectors(subject.word_vectors.words, random), **untrained_name)
    config = subject.module.config
    if config.arch == "bilm":
        return dataclasses.replace(subject, variables=elmo_layers.initial_variables(config, seed), **untrained_name)
    name = "decoder_input_tokens" if config.arch == "decoder" else "encoder_input_tokens"
    features = {name: jnp.ones((1, 8), jnp.int32)}
    if config.arch == "encoder_decoder":
        features["decoder_input_tokens"] = features["encoder_input_tokens"]
    variables = nn.unbox(subject.module.init(jax.random.key(seed), **features))
    return dataclasses.replace(subject, variables={"params": variables["params"]}, **untrained_name)
