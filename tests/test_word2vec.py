"""word2vec training against word2vec.c re-derived in numpy: the negative-sampling loss and its
update, subsampling's keep probabilities, the unigram^0.75 noise, the dynamic window's pairs; the
converter; and `t5lite train` on WikiText-2 writing vectors the gensim-equal evaluations read."""
import collections
import json
import math
import os

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO, shared_data_dir
from t5lite import cli
from t5lite.data import word2vec_vocab
from t5lite.data.converters import EXAMPLES_KEY
from t5lite.data.word2vec_converter import Word2VecConverter
from t5lite.data.word_vectors import load_word_vectors
from t5lite.errors import ConfigError
from t5lite.models import get_config
from t5lite.objectives import word2vec

TEXT = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog", "the end"]


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _word2vec_c_pair(syn0, syn1neg, last_word, word, negatives):
    """word2vec.c's skip-gram update for one (context `last_word`, centre `word`) pair at alpha 1
    (exact sigmoid; |f| < MAX_EXP here): (loss, delta syn0, delta syn1neg)."""
    d0, d1 = np.zeros_like(syn0), np.zeros_like(syn1neg)
    l1, neu1e, loss = syn0[last_word], np.zeros(syn0.shape[1]), 0.0
    for d, target in enumerate([word, *negatives]):
        if d > 0 and target == word:
            continue
        label = 1.0 if d == 0 else 0.0
        f = l1 @ syn1neg[target]
        g = label - _sigmoid(f)
        loss -= np.log(_sigmoid(f if label else -f))
        neu1e += g * syn1neg[target]
        d1[target] += g * l1
    d0[last_word] += neu1e
    return loss, d0, d1


def _tables(vocab=8, dim=6, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(0, 0.4, (vocab, dim)), rng.normal(0, 0.4, (vocab, dim))


def test_skipgram_loss_and_gradient_equal_word2vec_c_updates():
    syn0, syn1neg = _tables()
    contexts, centres = np.array([2, 5, 7]), np.array([3, 3, 1])
    negatives = np.array([[4, 3, 6], [1, 2, 7], [5, 6, 1]])    # 3 in the first row is the centre: skipped
    expected_loss, expected_d0, expected_d1 = 0.0, np.zeros_like(syn0), np.zeros_like(syn1neg)
    for context, centre, negs in zip(contexts, centres, negatives):
        loss, d0, d1 = _word2vec_c_pair(syn0, syn1neg, context, centre, negs)
        expected_loss, expected_d0, expected_d1 = expected_loss + loss, expected_d0 + d0, expected_d1 + d1

    def total(inputs, outputs):
        return jnp.sum(word2vec.negative_sampling_loss(inputs[contexts], outputs[centres], outputs[negatives],
                                                       negatives != centres[:, None]))

    loss, (g0, g1) = jax.value_and_grad(total, argnums=(0, 1))(jnp.asarray(syn0, jnp.float32),
                                                               jnp.asarray(syn1neg, jnp.float32))
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    # word2vec.c adds alpha * (label - s(f)) * ..., the negative gradient of the loss
    np.testing.assert_allclose(-np.asarray(g0), expected_d0, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(-np.asarray(g1), expected_d1, rtol=1e-4, atol=1e-7)


def test_cbow_loss_and_output_gradient_equal_word2vec_c_updates():
    """word2vec.c's CBOW (-cbow 1, mean): h = mean of the window's syn0 rows; the output rows move as
    in skip-gram; each context row gets the whole neu1e (`syn0[...] += neu1e[c]`), not the mean's
    own gradient neu1e / count."""
    syn0, syn1neg = _tables(seed=1)
    window, centre, negatives = np.array([1, 4, 6]), 2, np.array([5, 2, 7])
    h = syn0[window].mean(0)
    expected_loss, d1, neu1e = 0.0, np.zeros_like(syn1neg), np.zeros(syn0.shape[1])
    for d, target in enumerate([centre, *negatives]):
        if d > 0 and target == centre:
            continue
        label = 1.0 if d == 0 else 0.0
        f = h @ syn1neg[target]
        expected_loss -= np.log(_sigmoid(f if label else -f))
        neu1e += (label - _sigmoid(f)) * syn1neg[target]
        d1[target] += (label - _sigmoid(f)) * h

    objective = word2vec.Word2VecObjective(cbow=True, window=2, negatives=3)
    ids = jnp.array([[1, 4, centre, 6, 0]])
    contexts, mask = word2vec.context_window(ids, jnp.zeros_like(ids), 2)

    def total(inputs, outputs):
        hidden, centres, pair_mask = objective.pair_inputs(inputs, ids, contexts, mask)
        assert int(centres[0, 2]) == centre and bool(pair_mask[0, 2])
        return word2vec.negative_sampling_loss(hidden[0, 2], outputs[centre], outputs[negatives], negatives != centre)

    loss, (g0, g1) = jax.value_and_grad(total, argnums=(0, 1))(jnp.asarray(syn0, jnp.float32),
                                                               jnp.asarray(syn1neg, jnp.float32))
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    np.testing.assert_allclose(-np.asarray(g1), d1, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(-np.asarray(g0)[window], np.tile(neu1e, (len(window), 1)), rtol=1e-4)


def test_vocabulary_keep_probabilities_and_noise_equal_word2vec_formulas():
    vocab = word2vec_vocab.build(TEXT, min_count=2)
    counts = collections.Counter(w for line in TEXT for w in line.split())
    expected = sorted((w for w, c in counts.items() if c >= 2), key=lambda w: -counts[w])
    assert vocab.words == tuple(expected) and list(vocab.counts) == [counts[w] for w in expected]
    assert vocab.encode("the unicorn sat") == [vocab.words.index("the") + 1, vocab.words.index("sat") + 1]
    train_words = sum(counts[w] for w in expected)
    for sample in (1e-3, 1e-4, 0.1):
        t = sample * train_words
        keep = [min(1.0, (math.sqrt(counts[w] / t) + 1) * t / counts[w]) for w in expected]   # word2vec.c's `ran`
        np.testing.assert_allclose(vocab.keep_probabilities(sample), [0.0, *keep], rtol=1e-12)
    noise = np.array([counts[w] ** 0.75 for w in expected])
    np.testing.assert_allclose(vocab.noise_distribution(), [0.0, *(noise / noise.sum())], rtol=1e-12)


def test_negatives_follow_the_noise_distribution():
    vocab = word2vec_vocab.build(TEXT, min_count=1)
    p = vocab.noise_distribution()
    draws = np.asarray(word2vec.draw_negatives(jax.random.key(0), jnp.asarray(np.cumsum(p), jnp.float32), (200_000,)))
    frequencies = np.bincount(draws, minlength=len(p)) / draws.size
    assert frequencies[0] == 0
    sigma = np.sqrt(p * (1 - p) / draws.size)
    assert np.all(np.abs(frequencies - p) <= 5 * sigma + 1e-12), (frequencies, p)


def test_subsampling_keeps_words_with_their_probability_and_closes_ranks():
    ids = jnp.array([[3, 1, 2, 1, 4, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    keep = jnp.array([0.0, 0.3, 1.0, 0.0, 0.8])
    rng = jax.random.key(3)
    u = np.asarray(jax.random.uniform(rng, ids.shape))
    kept = np.asarray(word2vec.subsample(ids, keep, rng))
    for row, row_u, out in zip(np.asarray(ids), u, kept):
        expected = [w for w, x in zip(row, row_u) if w != 0 and x <= float(keep[w])]   # word2vec.c: drop if keep < u
        assert list(out) == expected + [0] * (len(row) - len(expected))
    many = np.asarray(word2vec.subsample(jnp.ones((1, 20_000), jnp.int32), keep, jax.random.key(1)))
    assert abs(np.mean(many != 0) - 0.3) < 0.02


@pytest.mark.parametrize("window", [1, 3])
def test_dynamic_window_pairs_equal_word2vec_c_loop(window):
    rng = np.random.default_rng(window)
    ids = np.zeros((3, 9), np.int32)
    for row, n in zip(ids, (9, 5, 1)):
        row[:n] = rng.integers(1, 20, n)
    reduced = rng.integers(0, window, ids.shape)
    contexts, mask = word2vec.context_window(jnp.asarray(ids), jnp.asarray(reduced), window)
    got = sorted((r, p, int(contexts[r, p, k])) for r, p, k in zip(*np.nonzero(np.asarray(mask))))
    expected = []
    for r, row in enumerate(ids):
        sentence_length = int(np.sum(row != 0))
        for position in range(sentence_length):
            b = reduced[r, position]
            for a in range(b, window * 2 + 1 - b):          # word2vec.c's window loop
                c = position - window + a
                if a != window and 0 <= c < sentence_length:
                    expected.append((r, position, int(row[c])))
    assert got == sorted(expected)


def test_converter_rows_drop_unknown_words_and_continue_long_lines():
    vocab = word2vec_vocab.build(TEXT, min_count=2)
    examples = [{"targets_pretokenized": t} for t in ["the cat sat on the mat the end", "zebra", "a dog"]]
    rows = list(Word2VecConverter(vocab).convert(examples, {"targets": 4}))
    ids = [vocab.encode(e["targets_pretokenized"]) for e in examples]
    assert [list(r["encoder_input_tokens"]) for r in rows] == [ids[0][:4], ids[0][4:] + [0] * (8 - len(ids[0])),
                                                                ids[2] + [0] * (4 - len(ids[2]))]
    assert [r[EXAMPLES_KEY] for r in rows] == [0, 1, 2]     # the unknown-only line counts with the next row


def _word2vec_c_alpha(starting_alpha, word_count_actual, iterations, train_words):
    """word2vec.c (github.com/tmikolov/word2vec, word2vec.c, `TrainModelThread`): alpha =
    starting_alpha * (1 - word_count_actual / (real)(iter * train_words + 1)); if (alpha <
    starting_alpha * 0.0001) alpha = starting_alpha * 0.0001."""
    alpha = starting_alpha * (1 - word_count_actual / (iterations * train_words + 1))
    return max(alpha, starting_alpha * 0.0001)


@pytest.mark.parametrize("cbow,starting_alpha", [(False, 0.025), (True, 0.05)])
def test_shipped_config_trains_with_word2vec_c_sgd_and_linear_decay(cbow, starting_alpha, clean_gin_state):
    """word2vec.c's defaults (-alpha 0.025 for skip-gram, 0.05 with -cbow 1): plain SGD, the rate
    falling linearly with the fraction of the training words read, floored at alpha x 1e-4; a step
    of B words after `step` steps of a `TRAIN_STEPS` run has read step x B of TRAIN_STEPS x B."""
    from t5lite.cli import parse_gin
    from t5lite.train import optimizers
    files = [str(REPO / "configs/local/word2vec_wikitext2.gin")] + \
        ([str(REPO / "gin/objectives/word2vec_cbow.gin")] if cbow else [])
    parse_gin(files, ["MODEL_DIR='unused'", "DATA_DIR='unused'"])
    total_steps, words_per_step = gin.query_parameter("%TRAIN_STEPS"), 32 * 128
    optimizer, schedule = optimizers.optimizer_and_schedule()
    for step in [0, 1, 17, total_steps // 2, total_steps - 1, total_steps, total_steps + 50]:
        expected = _word2vec_c_alpha(starting_alpha, step * words_per_step, 1, total_steps * words_per_step)
        # within word2vec.c's "+ 1" (a guard against 0 words) and float32's rounding of 1 - step / steps
        np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-5, atol=starting_alpha * 1e-6)
    params, grads = {"w": jnp.array([1.0, -2.0])}, {"w": jnp.array([0.5, 4.0])}
    state = optimizer.init(params)
    for step in range(3):    # params -= alpha(step) * gradient, no momentum or other state
        updates, state = optimizer.update(grads, state, params)
        np.testing.assert_allclose(updates["w"], -float(schedule(step)) * grads["w"], rtol=1e-6)


def _train(model_dir, steps, *bindings):
    data = shared_data_dir()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        cli.main(["train", "--gin_file=configs/local/word2vec_wikitext2.gin", f"--gin.MODEL_DIR='{model_dir}'",
                  f"--gin.DATA_DIR='{data}'", f"--gin.TRAIN_STEPS={steps}", *(f"--gin.{b}" for b in bindings)])
    finally:
        os.chdir(cwd)
        gin.clear_config()


def test_train_writes_word2vec_vectors_in_frequency_order(tmp_path, clean_gin_state):
    _train(tmp_path, 3, "BATCH_SIZE=4", "train.log_every=1", "model_config.overrides={'dim': 8}")
    vectors = load_word_vectors(tmp_path / "vectors.txt")
    assert vectors.vectors.shape[1] == 8 and vectors.words[:3] == ("<unk>", "the", ",")
    vocab = word2vec_vocab.build((shared_data_dir() / "text" / "wikitext-2" / "test.txt").read_text().splitlines(), 5)
    assert vectors.words == vocab.words
    recorded = json.loads((tmp_path / "model_config.json").read_text())
    assert (recorded["arch"], recorded["dim"], recorded["vocab_size"]) == ("word2vec", 8, vocab.vocab_size)
    again = word2vec.export_vectors(str(tmp_path), word2vec.Word2VecObjective(vocabulary=vocab),
                                    str(tmp_path / "again.txt"))
    np.testing.assert_array_equal(load_word_vectors(again).vectors, vectors.vectors)


@pytest.mark.parametrize("cbow", [False, True])
def test_flops_count_the_dynamic_windows_pairs_and_their_dot_products(cbow):
    """word2vec.c's loop: a centre word with reduced window b in [0, window) (uniform) scores every
    context word within window - b on either side (skip-gram: 1 + negatives dot products of dim each;
    CBOW: sums the context vectors, then scores once). Forward and backward: 3x."""
    window, negatives, dim, length = 4, 3, 7, 11
    pairs = np.mean([2 * (window - b) for b in range(window)])
    forward = (pairs * dim + 2 * (1 + negatives) * dim) if cbow else pairs * 2 * (1 + negatives) * dim
    objective = word2vec.Word2VecObjective(cbow=cbow, window=window, negatives=negatives)
    got = objective.train_flops_per_example(get_config("word2vec", dim=dim), {"encoder_input_tokens": length})
    np.testing.assert_allclose(got, 3 * forward * length, rtol=1e-12)


def test_a_transformer_preset_is_refused_with_the_preset_to_use():
    vocab = word2vec_vocab.build(TEXT, min_count=1)
    with pytest.raises(ConfigError, match="model_config.preset = 'word2vec'"):
        word2vec.Word2VecObjective(vocabulary=vocab).build_model(get_config("bert_tiny"))
    with pytest.raises(ConfigError, match="vocab_size"):
        word2vec.Word2VecObjective(vocabulary=vocab).build_model(get_config("word2vec", vocab_size=3))


def test_eval_every_is_refused_with_where_the_vectors_are_scored():
    with pytest.raises(ConfigError, match="leave train.eval_every at 0 .*word_similarity"):
        word2vec.Word2VecObjective().evaluators(None, "validation", {"inputs": 32})


def _analogies_above_random(vectors_file):
    """(trained, random control) analogy results on word2vec's questions (gensim's copy)."""
    datapath = pytest.importorskip("gensim.test.utils", reason="word2vec's questions ship with gensim").datapath
    from t5lite.analysis.word_similarity import evaluate_analogies
    from t5lite.data.word_vectors import WordVectors
    trained = load_word_vectors(vectors_file)
    control = WordVectors(trained.words, np.random.default_rng(0).normal(size=trained.vectors.shape))
    return (evaluate_analogies(trained, datapath("questions-words.txt")),
            evaluate_analogies(control, datapath("questions-words.txt")))


@pytest.mark.slow
def test_skipgram_on_wikitext2_answers_analogies_a_random_control_cannot(tmp_path, clean_gin_state):
    """The shipped config (1000 steps of word2vec.c's SGD, about 9 epochs of WikiText-2's test file,
    some 17 minutes): well above random vectors on the analogy questions whose words are in the
    vocabulary (26 of 1543 against 1 when measured)."""
    _train(tmp_path, 1000)
    trained, control = _analogies_above_random(tmp_path / "vectors.txt")
    assert trained["correct"] >= control["correct"] + 6, (trained["correct"], control["correct"])
