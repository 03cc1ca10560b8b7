"""Sentence embeddings from a checkpoint (`t5lite embed`), and their evaluation as registered tasks.

Every encoder is read as a `t5lite.models.sentence.BiEncoder` (its encoder, pooled): a t5lite run,
a bi-encoder trained with `SentenceObjective`, or a Hugging Face model imported with `t5lite
convert --from_hf` (its recorded tokenizer is the vocabulary). Texts are `[CLS] text [SEP]`
(t5lite.data.sentence_texts), padded per batch to a multiple of 16 tokens.

`SentenceEvaluator` scores a `sentence_*` task split (t5lite.data.tasks.sentence), what `t5lite
eval` runs for a config whose `train.objective` is a `SentenceObjective`:
- pairs with a `label` (STS-B): the cosine similarity of each pair's embeddings against the gold
  score, Pearson and Spearman x100 (sentence-transformers' EmbeddingSimilarityEvaluator reports
  the same correlations / 100);
- pairs without one (SQuAD question -> paragraph, Multi30k English -> German): each `text0` ranks
  the split's distinct `text1`s by cosine similarity; recall@1/5/10, MRR@10, nDCG@10 x100.
"""
from __future__ import annotations

import functools
import itertools
import logging
from typing import Mapping, Sequence

import gin
import jax
import numpy as np
from etils import epath

from t5lite import finite, metrics as metrics_lib
from t5lite.data import vocab as vocab_lib
from t5lite.data.sentence_texts import encode_text
from t5lite.data.word_vectors import WordVectors, load_word_vectors
from t5lite.errors import CheckpointError, ConfigError, DataError, require_positive
from t5lite.infer import checkpoint_reader, elmo_layers, predict
from t5lite.infer.evaluation import EvalResult
from t5lite.models import flops
from t5lite.models.sentence import BiEncoder
from t5lite.run_layout import RunDir

BUCKET = 16   # batches are padded to a multiple of this many tokens (few compiled shapes)

log = logging.getLogger(__name__)


@functools.partial(jax.jit, static_argnums=0)
def _embed(module, params, tokens):
    return module.apply({"params": params}, tokens, method="embed")


def embed_tokens(module: BiEncoder, params, rows: Sequence[np.ndarray], batch_size: int = 64,
                 normalize: bool = False) -> np.ndarray:
    """[len(rows), d_model] float32 embeddings of token rows (each without padding), in order;
    refused if any is not finite."""
    pad = module.config.pad_token_id
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        width = -(-max(len(r) for r in chunk) // BUCKET) * BUCKET
        tokens = np.full((batch_size, width), pad, np.int32)
        for row, ids in zip(tokens, chunk):
            row[:len(ids)] = ids
        out.append(np.asarray(_embed(module, params, tokens))[:len(chunk)])
    embeddings = np.concatenate(out) if out else np.zeros((0, module.config.d_model), np.float32)
    finite.require_finite(embeddings, "embeddings")
    return unit(embeddings) if normalize else embeddings


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class SentenceEvaluator:
    """One `sentence_*` task split, read once; `evaluate(module, params)` embeds and scores it."""

    def __init__(self, task, split: str, task_feature_lengths: Mapping[str, int], batch_size: int = 32,
                 data_dir: str | None = None, max_examples: int | None = None):
        self.task, self.split, self.batch_size = task, split, batch_size
        self.examples = list(itertools.islice(
            task.get_dataset(split, task_feature_lengths, shuffle=False, data_dir=data_dir), max_examples))
        if not self.examples:
            raise DataError(f"task {task.name!r} has no examples in split {split!r} (data_dir={data_dir!r}); "
                            "check the split name, data_dir and max_examples")
        if "text1" not in self.examples[0]:
            raise DataError(f"task {task.name!r} has one text per example; sentence evaluation scores pairs "
                            "(text0, text1)")
        self.similarity = "label" in self.examples[0]

    def __repr__(self):
        kind = "similarity" if self.similarity else "retrieval"
        return f"SentenceEvaluator({self.task.name!r}, split={self.split!r}, examples={len(self.examples)}, {kind})"

    def evaluate(self, module, params) -> EvalResult:
        """Its FLOPs: the encoder (t5lite.models.flops.encode_flops) over each text it embeds, at the
        text's own length (each example's two texts; retrieval: every query and each distinct text1
        once); the pooling and the batches' padding are not counted."""
        lengths = []

        def embed(rows):
            lengths.extend(len(row) for row in rows)
            return embed_tokens(module, params, rows, batch_size=self.batch_size, normalize=True)
        queries = embed([ex["text0"] for ex in self.examples])
        if self.similarity:
            cosines = np.sum(queries * embed([ex["text1"] for ex in self.examples]), axis=-1)
            targets = [float(ex["label"]) for ex in self.examples]
            scores = metrics_lib.compute_metrics(self.task.metric_fns, targets, [float(c) for c in cosines])
            records = [{"inputs": [ex["text0_pretokenized"], ex["text1_pretokenized"]], "target": t,
                        "prediction": float(c)} for ex, t, c in zip(self.examples, targets, cosines)]
            return EvalResult(scores, records, flops=_encode_flops(module, lengths))
        documents = {}   # distinct text1 -> its index in the corpus
        first = {}
        for ex in self.examples:
            first.setdefault(documents.setdefault(ex["text1_pretokenized"], len(documents)), ex["text1"])
        corpus = embed([first[i] for i in range(len(documents))])
        ranked = np.argsort(-(queries @ corpus.T), axis=-1, kind="stable")[:, :metrics_lib.RANK_CUTOFF]
        targets = [[documents[ex["text1_pretokenized"]]] for ex in self.examples]
        predictions = [[int(i) for i in row] for row in ranked]
        scores = metrics_lib.compute_metrics(self.task.metric_fns, targets, predictions)
        records = [{"inputs": ex["text0_pretokenized"], "target": t, "prediction": p}
                   for ex, t, p in zip(self.examples, targets, predictions)]
        return EvalResult({**scores, "corpus_size": float(len(documents))}, records,
                          flops=_encode_flops(module, lengths))


def _encode_flops(module, lengths) -> float:
    return float(sum(flops.encode_flops(module.config, n) for n in lengths))


@gin.configurable("embed", denylist=["texts"])
def embed(texts: Sequence[str], checkpoint_path: str = gin.REQUIRED, model=None, pooling: str = "mean",
          max_length: int = 256, batch_size: int = 64, normalize: bool = False,
          vocabulary_path: str | None = None, objective=None) -> np.ndarray:
    """[len(texts), dim] float32 embeddings, in input order, unit rows with `normalize`.

    `checkpoint_path` is an encoder's checkpoint: each text `[CLS] text [SEP]` (cut to `max_length`
    tokens) through its encoder, pooled (`pooling`: 'mean', 'cls', 'max'); `objective` (the training
    config's `SentenceObjective`, bound by `t5lite embed`) gives the pooling the run was trained with.
    An ELMo run's texts are split on whitespace, their layers averaged as allennlp's `elmo --average`
    averages them and pooled over the tokens, each batch from zero LSTM states: allennlp's
    `ElmoEmbedder` carries the states from batch to batch, so it agrees on the first `batch_size`
    texts only, while here a text's embedding does not depend on the texts before it; a word2vec run (its `vectors.txt`) or a word-vector file (word2vec
    text or binary, GloVe) pools the vectors of the words it has (`WordVectors.rows_of`), as
    sentence-transformers' average word embeddings do, a text with none of them giving zeros."""
    require_positive({"embed.max_length": max_length, "embed.batch_size": batch_size})
    if epath.Path(checkpoint_path).is_file():
        with finite.outputs_of(checkpoint_path):
            return _pooled_word_vectors(load_word_vectors(checkpoint_path), texts, pooling, normalize)
    checkpoint_reader.require_command_takes(checkpoint_path, "embed")
    step_dir = checkpoint_reader.step_directory(checkpoint_path)
    run = str(RunDir.of_step(step_dir))
    with finite.outputs_of(step_dir):
        model = predict.model_config_of(checkpoint_path, model)
        if model.arch == "word2vec":
            path = RunDir(run).word_vectors
            if not path.exists():
                raise CheckpointError(f"{path} does not exist (the run writes it at its last step); write it from the "
                                      "latest checkpoint with t5lite.objectives.word2vec.export_vectors(run_dir)")
            return _pooled_word_vectors(load_word_vectors(path), texts, pooling, normalize)
        if model.arch == "bilm":
            module, variables = elmo_layers.load_run(checkpoint_path)
            layers = elmo_layers.embed(module, variables, [text.split() for text in texts], batch_size=batch_size)
            return _pooled([np.mean(x, axis=0) for x in layers], pooling, normalize, 2 * module.config.projection_dim)
        vocab_lib.use_run_vocabulary(vocabulary_path, run)
        module = objective.build_model(model) if objective is not None else BiEncoder(model, pooling)
        if objective is None and checkpoint_reader.stored_param_names(step_dir) & {"backbone", "discriminator"}:
            params = checkpoint_reader.restore_model(step_dir, predict.abstract_params(model, module=module))
        else:
            params, _, _ = predict.load_params(model, checkpoint_path, module=module)
        rows = [encode_text(vocab_lib.DEFAULT_VOCABULARY, text, max_length) for text in texts]
        _warn_truncated(vocab_lib.DEFAULT_VOCABULARY, texts, rows, max_length)
        return embed_tokens(module, params, rows, batch_size, normalize)


def _warn_truncated(vocabulary, texts: Sequence[str], rows: Sequence[np.ndarray], max_length: int) -> None:
    """One warning for the texts cut to `max_length` tokens, as `t5lite infer` warns of its cuts: an
    embedding of a text's start is not one of the whole text. Only a full row can have been cut, so
    only those texts are encoded again to tell."""
    cut = [i for i, (text, row) in enumerate(zip(texts, rows))
           if len(row) == max_length and len(vocabulary.encode(text)) + 2 > max_length]
    predict.warn_truncated(log, cut, len(texts), f"embed.max_length={max_length} tokens (with [CLS] and [SEP])",
                           f"first {max_length} tokens", "raise embed.max_length to embed more of them")


def _pooled_word_vectors(vectors: WordVectors, texts: Sequence[str], pooling: str, normalize: bool) -> np.ndarray:
    """The texts' pooled word vectors; one warning for the texts with no known word, whose rows are zeros."""
    rows = [vectors.rows_of(text) for text in texts]
    unknown = [i for i, found in enumerate(rows) if not found]
    if unknown:
        log.warning("%d of %d inputs have no word the vectors know (input %s): their embeddings are zeros",
                    len(unknown), len(texts), predict.listed(unknown))
    return _pooled([vectors.vectors[found] for found in rows], pooling, normalize, vectors.vectors.shape[1])


def _pooled(token_vectors: Sequence[np.ndarray], pooling: str, normalize: bool, dim: int) -> np.ndarray:
    """Each text's [tokens, dim] vectors pooled to one row ('mean' or 'max'; zeros for no tokens)."""
    if pooling not in ("mean", "max"):
        raise ConfigError(f"embed.pooling={pooling!r}: word vectors and ELMo have no [CLS]; use 'mean' or 'max'")
    reduce = np.mean if pooling == "mean" else np.max
    rows = [reduce(x, axis=0) if len(x) else np.zeros(dim, np.float32) for x in token_vectors]
    embeddings = np.stack(rows).astype(np.float32) if rows else np.zeros((0, dim), np.float32)
    finite.require_finite(embeddings, "embeddings")
    return unit(embeddings) if normalize else embeddings
