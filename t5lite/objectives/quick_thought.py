"""Quick-Thought (Logeswaran and Lee 2018): two encoders f and g (t5lite.models.sentence.TwoEncoders,
each a pooled `BiEncoder` of one preset) read a batch of K consecutive sentences s_1..s_K (the
`consecutive_sentences` converter); with scores S_ij = f(s_i) . g(s_j) and the diagonal set to 0
as the authors' S2V code does (`src/s2v_model.py`, `build_loss`: `tf.matrix_set_diag(scores,
zeros)`, so exp(0) stays in the softmax's denominator), each sentence classifies its neighbours
at offsets -1 and +1 (those inside the batch and of its own paragraph, uniform targets) among the
batch's sentences. The loss is the softmax cross entropy averaged over the rows that have a
neighbour: the loader shuffles paragraphs, so the sentence after a paragraph's last one is not its
neighbour in the text (S2V has no paragraphs: its batch is one stretch of text).

f's params are the run's top-level params, so `t5lite embed` reads the run as any encoder run;
the paper's representation concatenates f and g, `embed_context` gives g.
"""
from __future__ import annotations

from typing import Any

import gin
import jax
import jax.numpy as jnp

from t5lite.errors import ConfigError
from t5lite.infer import checkpoint_reader
from t5lite.models.sentence import TwoEncoders
from t5lite.objectives.sentence import SentenceObjective


def neighbour_mask(k: int, paragraph=None):
    """[K, K] bool: j is a neighbour of i (offset -1 or +1, the same `paragraph` [K] when given)."""
    offsets = jnp.arange(k)[None, :] - jnp.arange(k)[:, None]
    neighbours = jnp.abs(offsets) == 1
    return neighbours if paragraph is None else neighbours & (paragraph[:, None] == paragraph[None, :])


def quick_thought_loss(u, v, paragraph=None):
    """Per-row loss [K] of f-embeddings `u` and g-embeddings `v` ([K, d], consecutive sentences),
    the neighbours confined to each row's `paragraph` ([K], optional); 0 for a row without one."""
    k = u.shape[0]
    if k < 2:
        raise ConfigError(f"Quick-Thought needs 2 or more consecutive sentences per (micro)batch, got {k}: "
                          "raise BATCH_SIZE")
    scores = jnp.einsum("id,jd->ij", u.astype(jnp.float32), v.astype(jnp.float32))
    log_probs = jax.nn.log_softmax(jnp.where(jnp.eye(k, dtype=bool), 0.0, scores), axis=-1)
    neighbours = neighbour_mask(k, paragraph)
    targets = neighbours / jnp.maximum(jnp.sum(neighbours, axis=-1, keepdims=True), 1)
    return -jnp.sum(jnp.where(neighbours, targets * log_probs, 0.0), axis=-1)


def _paragraph(batch):
    return batch["paragraph"][:, 0] if "paragraph" in batch else None


@gin.configurable
class QuickThoughtObjective(SentenceObjective):
    """Quick-Thought over the batch's `text0_input_tokens` (consecutive sentences), pooled with
    `pooling` ('mean', 'cls', 'max'). A (micro)batch is one candidate set."""
    loss_label = "cross entropy per sentence with a neighbour"

    def __init__(self, pooling: str = "mean"):
        super().__init__(loss="mnrl", pooling=pooling)

    def __repr__(self):
        return f"QuickThoughtObjective(pooling={self.pooling!r})"

    def build_model(self, config):
        return TwoEncoders(config, self.pooling)

    def normalizers(self, batch, loss):
        """The loss is a mean over the rows of `batch` that have a neighbour."""
        k = batch["text0_input_tokens"].shape[0]
        counted = jnp.any(neighbour_mask(k, _paragraph(batch)), axis=-1)
        return {"examples": jnp.maximum(jnp.sum(counted), 1).astype(jnp.float32)}

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss):
        tokens = batch["text0_input_tokens"]
        apply = lambda method, r: module.apply({"params": params}, tokens, enable_dropout=True, method=method,
                                               rngs={"dropout": r})
        per_row = quick_thought_loss(apply("embed", jax.random.fold_in(rng, 0)),
                                     apply("embed_context", jax.random.fold_in(rng, 1)), _paragraph(batch))
        counted = jnp.any(neighbour_mask(tokens.shape[0], _paragraph(batch)), axis=-1)
        total, n = jnp.sum(per_row), jnp.sum(counted).astype(jnp.float32)
        return total / normalizers["examples"], {"loss": (total, n), "examples": n}

    def train_flops_per_example(self, config, feature_lengths):
        return 2 * super().train_flops_per_example(config, feature_lengths)

    def initial_params(self, path: str, abstract_params) -> dict[str, Any]:
        """f and g both start from the checkpoint's encoder."""
        f = checkpoint_reader.restore_params(path, {k: v for k, v in abstract_params.items() if k != "context"})
        return {**f, "context": jax.tree.map(jnp.copy, f)}

    def evaluators(self, task, split, task_feature_lengths, **kwargs):
        """A `sentence_*` pair task (given a `text1` length, as `t5lite eval` on `sentence_stsb`) is
        scored as a bi-encoder's; the training corpus, one sentence per row, has nothing to score."""
        if "text1" not in task_feature_lengths:
            return {}
        return super().evaluators(task, split, task_feature_lengths, **kwargs)
