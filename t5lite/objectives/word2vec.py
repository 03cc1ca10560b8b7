"""word2vec training (Mikolov et al. 2013) as word2vec.c does it: skip-gram or CBOW with negative
sampling over the rows of the `word2vec` converter (gin: `train.objective = @Word2VecObjective()`).

Per step and row, on device, with the step's key:
- subsampling: each word is kept with t5lite.data.word2vec_vocab's keep probability, the kept words
  close ranks (windows then reach over the dropped ones, as in word2vec.c);
- dynamic window: each centre word draws b uniform in [0, window) and sees the words within
  window - b on either side;
- negatives: `negatives` ids per (context, centre) pair (per centre for CBOW) from the unigram^0.75
  distribution; a negative equal to the centre word is skipped, as word2vec.c skips it.

Loss of a pair with input vector h and centre word w: -log s(h . v_w) - sum_neg log s(-h . v_neg),
where s is the sigmoid, h the context word's input vector (skip-gram: word2vec.c predicts the centre
from each context word) or the mean of the window's input vectors (CBOW), and v the output vectors.
The step minimises the pairs' summed loss, so that plain SGD at rate alpha moves each table
row by alpha times the sum of its pairs' gradients: word2vec.c's update of every pair, applied
at once for the batch's pairs rather than one after the other. CBOW's mean passes its whole
gradient to each context word, as word2vec.c's does. The shipped configs train as word2vec.c:
SGD (`optimizers.sgd`) at alpha 0.025 (skip-gram) or 0.05 (CBOW), decaying linearly to
alpha x 1e-4 (`optimizers.linear_decay`). The logged `loss` is the mean per pair.
`export_vectors` writes the input table as a word2vec text file.
"""
from __future__ import annotations

import logging

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.data.word2vec_vocab import PAD_ID, Word2VecVocabulary, word2vec_vocabulary
from t5lite.data.word_vectors import WordVectors, save_word2vec
from t5lite.errors import ConfigError, require_positive
from t5lite.infer import checkpoint_reader
from t5lite.models.config import load_config
from t5lite.models.static import Word2Vec
from t5lite.models.static_config import Word2VecConfig
from t5lite.objectives.base import LossConfig, Objective
from t5lite.run_layout import RunDir

log = logging.getLogger("t5lite")


def subsample(ids, keep_probabilities, rng):
    """Each word of `ids` [..., length] kept with probability `keep_probabilities[id]`, the kept
    ones moved to the front of their row in order, 0 after (word2vec.c: discard when keep < u)."""
    keep = (ids != PAD_ID) & (jax.random.uniform(rng, ids.shape) <= keep_probabilities[ids])
    order = jnp.argsort(~keep, axis=-1, stable=True)
    return jnp.where(jnp.take_along_axis(keep, order, -1), jnp.take_along_axis(ids, order, -1), PAD_ID)


def offsets(window: int) -> np.ndarray:
    """The window's offsets, -window..-1, 1..window: the last axis of `context_window`."""
    return np.array([o for o in range(-window, window + 1) if o != 0])


def context_window(ids, reduced, window: int):
    """(context ids, mask), each [..., length, 2 * window]: the word at each offset of every
    position of `ids` [..., length] (words packed at the front, 0 after), counted when both words
    are real and |offset| <= window - reduced (word2vec.c's reduced window b)."""
    length = ids.shape[-1]
    padded = jnp.pad(ids, [(0, 0)] * (ids.ndim - 1) + [(window, window)])
    contexts = jnp.stack([padded[..., window + o:window + o + length] for o in offsets(window)], -1)
    mask = (ids[..., None] != PAD_ID) & (contexts != PAD_ID) & (np.abs(offsets(window)) <= window - reduced[..., None])
    return contexts, mask


def draw_negatives(rng, noise_cdf, shape):
    """Ids drawn from the distribution whose cumulative sums over the ids are `noise_cdf`."""
    u = jax.random.uniform(rng, shape) * noise_cdf[-1]
    return jnp.minimum(jnp.searchsorted(noise_cdf, u, side="right"), noise_cdf.shape[0] - 1).astype(jnp.int32)


def negative_sampling_loss(hidden, target, negatives, negative_mask):
    """-log s(h . v_target) - sum_k mask_k log s(-h . v_k): hidden and target [..., D], negatives
    [..., K, D], negative_mask [..., K]."""
    positive = jnp.sum(hidden * target, -1)
    negative = jnp.einsum("...d,...kd->...k", hidden, negatives)
    return -jax.nn.log_sigmoid(positive) - jnp.sum(negative_mask * jax.nn.log_sigmoid(-negative), -1)


@gin.configurable
class Word2VecObjective(Objective):
    """Skip-gram (or `cbow=True`) with negative sampling on the tables of a `Word2VecConfig`
    (`model_config.preset = 'word2vec'`; its `dim` is the vector size). `window`: the largest
    window; `negatives`: noise words per pair; `sample`: the subsampling threshold t (0: off).
    The vocabulary is gin's `word2vec_vocabulary` (t5lite.data.word2vec_vocab)."""
    loss_label = "negative-sampling loss per (word, context) pair"

    def __init__(self, cbow: bool = False, window: int = 5, negatives: int = 5, sample: float = 1e-3,
                 vocabulary: Word2VecVocabulary | None = None):
        require_positive({"Word2VecObjective.window": window, "Word2VecObjective.negatives": negatives})
        if sample < 0:
            raise ConfigError(f"Word2VecObjective.sample={sample}: the subsampling threshold is >= 0 (0: off)")
        self.cbow, self.window, self.negatives, self.sample = cbow, window, negatives, sample
        self._vocabulary = vocabulary

    @property
    def vocabulary(self) -> Word2VecVocabulary:
        return self._vocabulary or word2vec_vocabulary()

    def complete_config(self, config):
        """The config with the vocabulary's size filled in (`vocab_size` 0); a word2vec config is required."""
        if not isinstance(config, Word2VecConfig):
            raise ConfigError(f"Word2VecObjective trains word2vec's tables; got a {type(config).__name__}: set "
                              "model_config.preset = 'word2vec' (dim 100) or 'word2vec_300'")
        size = self.vocabulary.vocab_size
        if config.vocab_size not in (0, size):
            raise ConfigError(f"model_config.vocab_size={config.vocab_size} but the word2vec vocabulary has {size} "
                              "ids: leave vocab_size unset (0) so the run takes the vocabulary's size")
        require_positive({"model_config dim": config.dim})
        return config.replace(vocab_size=size)

    def build_model(self, config) -> nn.Module:
        config = self.complete_config(config)
        vocabulary = self.vocabulary
        self.keep_probabilities = jnp.asarray(vocabulary.keep_probabilities(self.sample), jnp.float32)
        self.noise_cdf = jnp.asarray(np.cumsum(vocabulary.noise_distribution()), jnp.float32)
        log.info("word2vec: %d words, %s, dim %d, window %d, %d negatives, sample %g", len(vocabulary.words),
                 "CBOW" if self.cbow else "skip-gram", config.dim, self.window, self.negatives, self.sample)
        return Word2Vec(config.vocab_size, config.dim)

    def evaluators(self, task, split, task_feature_lengths, **kwargs):
        """Refused: word2vec.c has no held-out loss; its vectors are scored by analogies and similarity."""
        raise ConfigError("word2vec has no held-out evaluation: leave train.eval_every at 0 and score the run's "
                          "vectors.txt with t5lite.analysis.word_similarity (docs/guides/word-vectors.md)")

    def train_flops_per_example(self, config, feature_lengths):
        """Forward + backward (3x forward) FLOPs of a row of words before subsampling. A centre word
        sees window + 1 context words on average (the dynamic window draws window - b, b uniform in
        [0, window), on either side); each (context, centre) pair scores 1 + negatives dot products of
        `dim` (skip-gram); CBOW first averages the window (its adds) and scores once per centre."""
        dim, pairs, scores = config.dim, self.window + 1, 1 + self.negatives
        per_word = (pairs * dim + 2 * scores * dim) if self.cbow else pairs * 2 * scores * dim
        return 3 * per_word * feature_lengths.get("encoder_input_tokens", 0)

    def embedding_rows(self, config) -> None:
        return None    # the tables are as big as the word2vec vocabulary; the task's token ids are not read

    def normalizers(self, batch, loss: LossConfig):
        return {}    # the step's loss is the pairs' sum (see the module's docstring)

    def loss_and_metrics(self, module: nn.Module, params, batch, rng, normalizers, loss: LossConfig):
        sample_rng, window_rng, negative_rng = jax.random.split(rng, 3)
        words = batch["encoder_input_tokens"]
        ids = subsample(words, self.keep_probabilities, sample_rng)
        reduced = jax.random.randint(window_rng, ids.shape, 0, self.window)
        contexts, mask = context_window(ids, reduced, self.window)
        inputs, outputs = module.apply({"params": params}, method="tables")
        pair_loss, mask = self.pair_losses(inputs, outputs, ids, contexts, mask, negative_rng)
        pairs = jnp.sum(mask).astype(jnp.float32)
        total = jnp.sum(pair_loss * mask)
        metrics = {"loss": (total, pairs), "pairs": pairs,
                   "kept_words": (jnp.sum(ids != PAD_ID).astype(jnp.float32),
                                  jnp.sum(words != PAD_ID).astype(jnp.float32))}
        return total, metrics

    def pair_inputs(self, inputs, ids, contexts, mask):
        """(h, centre ids, mask) of every pair: [..., length, 2 * window] pairs (a context word's input
        vector each) for skip-gram, [..., length] for CBOW (the mean over the window)."""
        if self.cbow:
            count = jnp.sum(mask, -1, keepdims=True)
            total = jnp.sum(inputs[contexts] * mask[..., None], -2)
            # the mean forward; backward each context row gets h's whole gradient, as word2vec.c adds
            # neu1e to every one of them (the mean's own gradient would be neu1e / count)
            hidden = total + jax.lax.stop_gradient(total / jnp.maximum(count, 1) - total)
            return hidden, ids, count[..., 0] > 0
        return inputs[contexts], jnp.broadcast_to(ids[..., None], contexts.shape), mask

    def pair_losses(self, inputs, outputs, ids, contexts, mask, rng):
        """(loss, mask) of every pair, with `negatives` noise words each."""
        hidden, centres, mask = self.pair_inputs(inputs, ids, contexts, mask)
        negatives = draw_negatives(rng, self.noise_cdf, centres.shape + (self.negatives,))
        skip = negatives != centres[..., None]          # word2vec.c skips a negative equal to the centre
        return negative_sampling_loss(hidden, outputs[centres], outputs[negatives], skip), mask

    def finish(self, model_dir: str, params) -> None:
        """The trained vectors as MODEL_DIR/vectors.txt (word2vec text format)."""
        if jax.process_index() == 0:
            path = RunDir(model_dir).word_vectors
            save_vectors(params, self.vocabulary, path)
            log.info("wrote %s", path)


def word_vectors(params, vocabulary: Word2VecVocabulary) -> WordVectors:
    """The input vectors of the vocabulary's words (the pad row left out), most frequent first."""
    return WordVectors(vocabulary.words, np.asarray(params["input_embedding"])[1:])


def save_vectors(params, vocabulary: Word2VecVocabulary, path) -> None:
    """Writes the input vectors of the vocabulary's words (the pad row left out), most frequent
    first, as a word2vec text file."""
    save_word2vec(word_vectors(params, vocabulary), path)


def export_vectors(model_dir: str, objective: Word2VecObjective | None = None, path: str | None = None) -> str:
    """Writes the word vectors of the latest checkpoint of the run in `model_dir` (its
    `model_config.json` says the tables' size; `objective` gives the vocabulary, default gin's
    `Word2VecObjective()`) to `path` (default MODEL_DIR/vectors.txt)."""
    objective = objective or Word2VecObjective()
    run = RunDir(model_dir)
    module = objective.build_model(load_config(run.model_config))
    abstract = jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.ones((1, 1), jnp.int32)))
    params = checkpoint_reader.restore_params(model_dir, nn.unbox(abstract)["params"])
    path = path or str(run.word_vectors)
    save_vectors(params, objective.vocabulary, path)
    return path
