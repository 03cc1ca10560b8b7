"""Quick-Thought: the loss equals the authors' S2V loss transcribed in numpy (S_ij = f(s_i) . g(s_j),
diagonal set to 0, uniform targets over the in-batch neighbours at -1 and +1); the
`consecutive_sentences` converter gives WikiText-2's sentences in corpus order; the config trains
bert_tiny for 3 steps through `t5lite train` and `t5lite embed` reads the run's encoder f."""
import json
import os

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import REPO, assert_close, assert_embed_reads_run, shared_data_dir

from t5lite import cli
from t5lite.data import catalog
from t5lite.data.loader import Loader
from t5lite.data.sentence_texts import encode_text
from t5lite.data.vocab import DEFAULT_VOCABULARY
from t5lite.objectives.quick_thought import quick_thought_loss

CONFIG = str(REPO / "configs/local/bert_tiny_quick_thought.gin")
pytestmark = pytest.mark.usefixtures("clean_gin_state")


def _s2v_losses(u, v, context_size=1, paragraph=None):
    """Per-row losses of the authors' code, transcribed in numpy: github.com/lajanugen/S2V,
    src/s2v_model.py, `s2v.build_loss` (no dropout): scores = src @ dst^T,
    `tf.matrix_set_diag(scores, zeros)`, targets = sum of np.eye(batch, k=pos) for pos in
    [-context_size, context_size] but 0, each row divided by its sum, and
    `tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=scores)` (then reduce_mean).
    `paragraph`: t5lite's one change, a target only inside the row's paragraph (S2V's batch is one
    stretch of text); a row left without one scores 0."""
    batch = len(u)
    scores = u @ v.T
    np.fill_diagonal(scores, 0.0)
    targets = np.zeros((batch, batch))
    for pos in [p for p in range(-context_size, context_size + 1) if p != 0]:
        targets += np.eye(batch, k=pos)
    if paragraph is not None:
        targets *= paragraph[:, None] == paragraph[None, :]
    targets = targets / np.maximum(np.sum(targets, axis=1, keepdims=True), 1)
    log_softmax = scores - scores.max(axis=1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(axis=1, keepdims=True))
    return -np.sum(targets * log_softmax, axis=1)


@pytest.mark.parametrize("k", [2, 3, 7])
def test_loss_equals_the_authors_s2v_loss_on_random_embeddings(k):
    """The diagonal is a logit of 0, as S2V's, not -inf: exp(0) stays in each row's denominator."""
    rng = np.random.RandomState(k)
    u, v = rng.normal(size=(k, 5)).astype(np.float32), rng.normal(size=(k, 5)).astype(np.float32)
    ours = np.asarray(quick_thought_loss(jnp.asarray(u), jnp.asarray(v)))
    reference = _s2v_losses(u.astype(np.float64), v.astype(np.float64))
    assert_close(ours, reference, rtol=1e-5)
    assert_close(float(ours.mean()), float(reference.mean()), rtol=1e-5)   # S2V's reduce_mean: every row counts
    # the first row has one neighbour (s_2): -log p(s_2) among s_2..s_K and the diagonal's exp(0)
    scores = u[0].astype(np.float64) @ v[1:].T.astype(np.float64)
    assert_close(float(ours[0]), float(np.log(1 + np.exp(scores).sum()) - scores[0]), rtol=1e-5)


def test_neighbours_stay_inside_their_paragraph():
    """The loader shuffles paragraphs: the sentence after a paragraph's last one is no neighbour;
    a sentence alone in its paragraph in the batch has no target and adds nothing."""
    rng = np.random.RandomState(0)
    u, v = rng.normal(size=(7, 5)).astype(np.float32), rng.normal(size=(7, 5)).astype(np.float32)
    paragraph = np.array([4, 4, 4, 9, 2, 2, 2])
    ours = np.asarray(quick_thought_loss(jnp.asarray(u), jnp.asarray(v), jnp.asarray(paragraph)))
    assert_close(ours, _s2v_losses(u.astype(np.float64), v.astype(np.float64), paragraph=paragraph), rtol=1e-5)
    assert ours[3] == 0.0
    assert not np.allclose(ours, np.asarray(quick_thought_loss(jnp.asarray(u), jnp.asarray(v))))


def _wikitext_sentences(count):
    """The first `count` sentences of WikiText-2's validation file: paragraphs split at " . ", headings skipped."""
    sentences = []
    with open(shared_data_dir() / "text" / "wikitext-2" / "valid.txt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or (line.startswith("=") and line.endswith("=")):
                continue
            parts = line[:-2].split(" . ") if line.endswith(" .") else line.split(" . ")
            sentences.extend(p + " ." for p in parts)
            if len(sentences) >= count:
                return sentences[:count]


def test_consecutive_wikitext2_sentences_arrive_in_order_in_a_batch():
    length, batch_size = 48, 8
    loader = Loader(catalog.get_task_or_mixture("wikitext2"), "validation", {"text0": length}, batch_size,
                    "consecutive_sentences", pack=False, shuffle=False, repeat=False,
                    data_dir=str(shared_data_dir()))
    batches = iter(loader)
    rows = np.concatenate([next(batches)["text0_input_tokens"] for _ in range(2)])
    expected = _wikitext_sentences(2 * batch_size)
    assert expected[0].startswith("Homarus gammarus , known as the European lobster")
    for row, sentence in zip(rows, expected):
        ids = encode_text(DEFAULT_VOCABULARY, sentence, length)
        np.testing.assert_array_equal(row[:len(ids)], ids)
        assert not row[len(ids):].any()


def test_a_resumed_loader_starts_again_at_the_paragraph_it_stopped_in():
    def loader():
        return Loader(catalog.get_task_or_mixture("wikitext2"), "validation", {"text0": 48}, 8,
                      "consecutive_sentences", pack=False, shuffle=False, repeat=False, data_dir=str(shared_data_dir()))
    straight = loader()
    batches = iter(straight)
    first = next(batches)
    state = straight.state()
    rest = [next(batches) for _ in range(2)]
    rows = np.concatenate([b["text0_input_tokens"] for b in [first, *rest]])
    paragraphs = np.concatenate([b["paragraph"][:, 0] for b in [first, *rest]])
    assert paragraphs[7] == paragraphs[8]   # the first batch ends inside a paragraph
    start = int(np.argmax(paragraphs == paragraphs[7]))
    assert start < 7 and len(set(paragraphs[:start])) == 1
    resumed = loader()
    resumed.restore(state)
    np.testing.assert_array_equal(next(iter(resumed))["text0_input_tokens"], rows[start:start + 8])


def test_config_trains_bert_tiny_and_t5lite_embed_reads_its_encoder(tmp_path):
    run = str(tmp_path / "qt")
    cli.main(["train", f"--gin_file={CONFIG}", f"--gin.MODEL_DIR='{run}'", "--gin.DATA_DIR=None",
              "--gin.MIXTURE_OR_TASK_NAME='embedded_docs_lines'", "--gin.TASK_FEATURE_LENGTHS={'text0': 32}",
              "--gin.BATCH_SIZE=8", "--gin.TRAIN_STEPS=3", "--gin.train.log_every=1", "--gin.train.checkpoint_every=3",
              "--gin.warmup_cosine.warmup_steps=1"])
    with open(os.path.join(run, "metrics.jsonl")) as f:
        losses = [r["loss"] for r in map(json.loads, f) if "loss" in r]
    assert len(losses) == 3 and np.isfinite(losses).all()
    # an untrained encoder: about log(7) (7 candidates), not far from it after 3 steps
    assert losses[0] == pytest.approx(np.log(7), rel=0.3)
    params = ocp.StandardCheckpointer().restore(os.path.join(run, "checkpoints", "3", "state"))["params"]
    assert "context" in params and set(params) - {"context"} == set(params["context"])
    assert_embed_reads_run(run, CONFIG, tmp_path, 64)
