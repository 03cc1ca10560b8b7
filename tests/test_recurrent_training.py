"""Pre-training the recurrent families with `t5lite train`: the word vocabulary and converters, the
biLM's forward + backward LM loss against numpy, short runs whose loss falls and that resume, and
the converter between an ELMo run and the original bilm files (both directions)."""
from __future__ import annotations

import json
import math
import os

import flax.linen as nn
import gin
import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO, logged_losses, shared_data_dir
from test_elmo import _allennlp_ids
from t5lite import cli
from t5lite.data import word_vocab
from t5lite.data.word_converters import WordClassificationConverter, WordLMConverter
from t5lite.errors import ConfigError
from t5lite.interop import elmo
from t5lite.models.recurrent import BiLMLanguageModel
from t5lite.models.recurrent_config import BiLMConfig
from t5lite.objectives.base import LossConfig
from t5lite.objectives.recurrent import BiLMObjective

ELMO = shared_data_dir() / "elmo"
TEXTS = ["the cat sat on the mat .", "the dog sat .", "a cat ran"]


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _use_vocabulary(vocabulary, monkeypatch):
    from t5lite.data import word_converters
    from t5lite.objectives import recurrent as recurrent_objectives
    for module in (word_converters, recurrent_objectives):
        monkeypatch.setattr(module, "word_vocabulary", lambda: vocabulary)


def test_word_vocabulary_keeps_the_most_frequent_words_after_bilm_specials(tmp_path):
    vocab = word_vocab.build(TEXTS, size=7)
    # pad, </S>, <S>, <UNK>, then "the" (3), "cat" and "sat" (2 each, in order of appearance).
    assert vocab.vocab_size == 7 and vocab.words == ["</S>", "<S>", "<UNK>", "the", "cat", "sat"]
    assert vocab.encode("the dog sat") == [4, 3, 6] and vocab.decode([4, 3, 6, 0]) == "the <UNK> sat"
    vocab.save(tmp_path / "vocab.txt")
    assert (tmp_path / "vocab.txt").read_text().splitlines()[:3] == ["</S>", "<S>", "<UNK>"]
    assert word_vocab.WordVocabulary.load(str(tmp_path / "vocab.txt")).words == vocab.words
    assert word_vocab.build(["The the"], lowercase=True).words[3:] == ["the"]


def test_word_lm_chars_rows_frame_the_sentence_with_elmo_ids(monkeypatch):
    vocab = word_vocab.build(TEXTS)
    _use_vocabulary(vocab, monkeypatch)
    converter = WordLMConverter(chars=True)
    (row,) = converter.convert([{"targets_pretokenized": "the cat naïve"}], {"targets": 6})
    assert row["encoder_input_tokens"].tolist() == [2, vocab.encode("the")[0], vocab.encode("cat")[0], 3, 1, 0]
    chars = row["encoder_input_chars"].reshape(6, 50)
    expected = [_allennlp_ids(256), _allennlp_ids(b"the"), _allennlp_ids(b"cat"),
                _allennlp_ids("naïve".encode()), _allennlp_ids(257), [0] * 50]
    assert chars.tolist() == expected
    # Cut to the length: <S>, the first words, </S>.
    (row,) = converter.convert([{"targets_pretokenized": "the cat sat on"}], {"targets": 4})
    assert vocab.decode(row["encoder_input_tokens"]) == "<S> the cat </S>"
    with pytest.raises(ConfigError, match="train.pack = False"):
        next(converter.convert([], {"targets": 4}, pack=True))
    (row,) = WordClassificationConverter().convert([{"inputs_pretokenized": "an cat", "label": 1}], {"inputs": 5})
    assert row["label"].tolist() == [1] and vocab.decode(row["encoder_input_tokens"]) == "<S> <UNK> cat </S>"


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_bilm_loss_is_the_mean_of_forward_and_backward_next_word_losses(monkeypatch):
    vocab = word_vocab.build(TEXTS)
    _use_vocabulary(vocab, monkeypatch)
    cfg = BiLMConfig(filters=((1, 4), (2, 4)), char_embed_dim=4, n_highway=1, lstm_dim=8, projection_dim=4,
                     vocab_size=vocab.vocab_size)
    rows = list(WordLMConverter(chars=True).convert([{"targets_pretokenized": t} for t in TEXTS], {"targets": 8}))
    batch = {k: jnp.asarray(np.stack([r[k] for r in rows])) for k in ("encoder_input_tokens", "encoder_input_chars")}
    objective = BiLMObjective()
    module = objective.build_model(cfg)
    params = nn.unbox(module.init(jax.random.key(0), **batch))["params"]
    # Non-trivial softmax weights, so that the targets' positions matter.
    params["softmax_kernel"] = jax.random.normal(jax.random.key(1), params["softmax_kernel"].shape)
    forward, backward = (np.asarray(x, np.float64) for x in module.apply({"params": params}, **batch))
    tokens = np.asarray(batch["encoder_input_tokens"])
    losses = []
    for b, text in enumerate(TEXTS):
        ids = tokens[b, :len(text.split()) + 2]
        for t in range(len(ids) - 1):                  # the forward LM at t predicts t + 1 ...
            losses.append(-_log_softmax(forward[b, t])[ids[t + 1]])
        for t in range(1, len(ids)):                   # ... the backward LM at t predicts t - 1
            losses.append(-_log_softmax(backward[b, t])[ids[t - 1]])
    loss = LossConfig(z_loss=0.0)
    value, metrics = objective.loss_and_metrics(module, params, batch, None, objective.normalizers(batch, loss), loss)
    np.testing.assert_allclose(float(value), np.mean(losses), rtol=1e-5)
    assert float(metrics["target_tokens"]) == len(losses)


def _train(config, model_dir, steps, bindings):
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        cli.main(["train", f"--gin_file=configs/local/{config}.gin", f"--gin.MODEL_DIR='{model_dir}'",
                  f"--gin.TRAIN_STEPS={steps}", "--gin.BATCH_SIZE=8", "--gin.train.log_every=1",
                  "--gin.train.checkpoint_every=4", "--gin.DATA_DIR=None", "--gin.train.eval_every=0",
                  "--gin.MIXTURE_OR_TASK_NAME='embedded_docs_lines'", "--gin.train.train_split='train'",
                  "--gin.word_vocabulary.task='embedded_docs_lines'", "--gin.word_vocabulary.split='train'",
                  "--gin.word_vocabulary.size=512", "--gin.model_config.vocab_size=512",
                  "--gin.TASK_FEATURE_LENGTHS={'targets': 16}", "--gin.warmup_cosine.warmup_steps=1",
                  "--gin.warmup_cosine.peak_learning_rate=1e-2", *(f"--gin.{b}" for b in bindings)])
    finally:
        os.chdir(cwd)
        gin.clear_config()


# The ELMo run is slow (a char CNN over every word); its fast siblings are the loss test above and the
# AWD-LSTM run, which goes through the same trainer path.
@pytest.mark.parametrize("config", [pytest.param("elmo_tiny_wikitext2", marks=pytest.mark.slow),
                                    "awd_lstm_tiny_wikitext2"])
def test_tiny_lm_trains_logs_perplexity_and_resumes(tmp_path, config):
    # ELMo at the config's own peak rate: at 1e-2 its loss jumps from 5.0 to 11.7 at step 4.
    rate = ["warmup_cosine.peak_learning_rate=3e-3"] if config.startswith("elmo") else []
    _train(config, tmp_path, 8, rate)
    losses = logged_losses(tmp_path)
    assert sorted(losses) == list(range(1, 9)) and all(math.isfinite(v) for v in losses.values())
    assert (losses[7] + losses[8]) / 2 < losses[1] - 0.1, losses
    last = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert math.isclose(last["perplexity"], math.exp(last["loss"]), rel_tol=1e-4)
    _train(config, tmp_path, 10, rate)    # resumes from step 8
    assert sorted(logged_losses(tmp_path)) == list(range(1, 11))
    assert json.loads((tmp_path / "model_config.json").read_text())["arch"] in ("bilm", "awd_lstm")


def test_bilm_files_round_trip_through_a_t5lite_run_and_the_cli(tmp_path):
    config = elmo.to_run(str(ELMO / "options.json"), str(ELMO / "lm_weights.hdf5"), str(tmp_path / "run"),
                         vocab_size=16)
    assert config.vocab_size == 16
    elmo.from_run(str(tmp_path / "run"), str(tmp_path / "options.json"), str(tmp_path / "weights.hdf5"))
    assert json.loads((tmp_path / "options.json").read_text()) == json.loads((ELMO / "options.json").read_text())
    # The same through `t5lite convert --from_elmo / --to_elmo`.
    cli.main(["convert", "--from_elmo", str(ELMO / "lm_weights.hdf5"), "--elmo_options", str(ELMO / "options.json"),
              "--out", str(tmp_path / "cli_run")])
    cli.main(["convert", "--to_elmo", str(tmp_path / "cli_run"), "--out", str(tmp_path / "cli_files")])
    assert (tmp_path / "cli_files" / "options.json").read_text() == (tmp_path / "options.json").read_text()
    with h5py.File(ELMO / "lm_weights.hdf5") as original, h5py.File(tmp_path / "weights.hdf5") as written, \
            h5py.File(tmp_path / "cli_files" / "weights.hdf5") as from_cli:
        names = []
        original.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        for name in names:
            np.testing.assert_array_equal(written[name][...], original[name][...], err_msg=name)
            np.testing.assert_array_equal(from_cli[name][...], original[name][...], err_msg=name)


def test_a_trained_run_written_as_bilm_files_embeds_as_the_run(tmp_path):
    """t5lite run -> hdf5 -> load: the embeddings equal the run's own biLM on its params."""
    cfg = BiLMConfig.from_options(json.loads((ELMO / "options.json").read_text()), vocab_size=12)
    module = BiLMLanguageModel(cfg)
    tokens = jnp.ones((1, 3), jnp.int32)
    params = nn.unbox(module.init(jax.random.key(7), tokens, jnp.ones((1, 150), jnp.int32)))["params"]
    from t5lite.interop.checkpoint import _write_run
    _write_run(module, {"params": params}, str(tmp_path / "run"), {})
    elmo.from_run(str(tmp_path / "run"), str(tmp_path / "o.json"), str(tmp_path / "w.hdf5"))
    loaded, variables = elmo.load(str(tmp_path / "o.json"), str(tmp_path / "w.hdf5"))
    sentences = [["The", "cat", "sat"], ["naïve", "ideas"]]
    ours = elmo.embed(loaded, variables, sentences)
    direct = elmo.embed(loaded, {"params": params["bilm"]}, sentences)
    for a, b in zip(ours, direct):
        np.testing.assert_array_equal(a, b)
    # Every weight comes back; the pad row of the char table (id 0, never looked up) is not in the file.
    params["bilm"]["char_cnn"]["char_embed"] = params["bilm"]["char_cnn"]["char_embed"].at[0].set(0.0)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), variables["params"], params["bilm"]))


def test_sampled_softmax_matches_the_tf_formula_in_numpy():
    """tf.nn.sampled_softmax_loss (Jean et al., 2015) with given samples: logits of the true word and
    the samples, each minus log(expected count), accidental hits removed, cross entropy on the true."""
    from t5lite.objectives import recurrent as R
    rng = np.random.default_rng(0)
    vocab, dim, k = 50, 6, 5
    hidden = rng.normal(size=(2, 3, dim)).astype(np.float32)
    kernel = rng.normal(size=(dim, vocab)).astype(np.float32)
    bias = rng.normal(size=vocab).astype(np.float32)
    targets = np.array([[4, 7, 9], [3, 12, 4]], np.int32)
    sampled = np.array([1, 4, 20, 33, 2], np.int32)            # 4 is an accidental hit for two positions
    q = np.log((np.arange(vocab) + 2) / (np.arange(vocab) + 1)) / np.log(vocab + 1)
    ours = np.asarray(R.sampled_softmax_losses(jnp.asarray(hidden), jnp.asarray(kernel), jnp.asarray(bias),
                                               jnp.asarray(targets), jnp.asarray(sampled),
                                               jnp.log(jnp.asarray(q[sampled])), k))
    for b in range(2):
        for t in range(3):
            y = targets[b, t]
            logits = [hidden[b, t] @ kernel[:, y] + bias[y] - np.log(k * q[y])]
            logits += [hidden[b, t] @ kernel[:, s] + bias[s] - np.log(k * q[s]) for s in sampled if s != y]
            logits = np.array(logits, np.float64)
            expected = -(logits[0] - np.log(np.exp(logits - logits.max()).sum()) - logits.max())
            np.testing.assert_allclose(ours[b, t], expected, rtol=1e-5)
    # The sampler draws from that distribution: frequent (low) ids far more often than rare ones.
    ids, log_prob = R.log_uniform_sample(jax.random.key(0), 20000, vocab)
    counts = np.bincount(np.asarray(ids), minlength=vocab) / 20000
    np.testing.assert_allclose(counts[:3], q[:3], rtol=0.05)
    np.testing.assert_allclose(np.exp(np.asarray(log_prob)), q[np.asarray(ids)], rtol=1e-5)


def test_bilm_objective_with_sampled_softmax_gives_a_finite_loss_and_gradient(monkeypatch):
    vocab = word_vocab.build(TEXTS)
    _use_vocabulary(vocab, monkeypatch)
    cfg = BiLMConfig(filters=((1, 4),), char_embed_dim=4, n_highway=1, lstm_dim=8, projection_dim=4,
                     vocab_size=vocab.vocab_size)
    rows = list(WordLMConverter(chars=True).convert([{"targets_pretokenized": t} for t in TEXTS], {"targets": 8}))
    batch = {k: jnp.asarray(np.stack([r[k] for r in rows])) for k in ("encoder_input_tokens", "encoder_input_chars")}
    objective = BiLMObjective(num_sampled=4)
    module = objective.build_model(cfg)
    params = nn.unbox(module.init(jax.random.key(0), **batch))["params"]
    loss = LossConfig(z_loss=0.0)
    grads, metrics = jax.jit(jax.grad(lambda p: objective.loss_and_metrics(module, p, batch, jax.random.key(1),
                                                                           objective.normalizers(batch, loss), loss),
                                      has_aux=True))(params)
    assert np.isfinite(float(metrics["loss"][0])) and float(jnp.abs(grads["softmax_kernel"]).sum()) > 0


class _Sentences:
    """A task stub: TEXTS as the examples of every split."""
    name = "sentences"

    def get_dataset(self, split, task_feature_lengths, data_dir=None):
        return iter([{"targets_pretokenized": t} for t in TEXTS])


def _lm_macs_per_word_from_shapes(params) -> float:
    """Every kernel's size once per word (LSTM gates and projections, highway layers, the char CNN's
    projection), a char-CNN filter of width w at each of its 50 - w + 1 positions, the biLM's one softmax
    once per direction, AWD-LSTM's tied embedding once as its decoder; other lookups are free."""
    macs = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        name = jax.tree_util.keystr(path)
        if leaf.ndim < 2 or name == "['bilm']['char_cnn']['char_embed']":
            continue
        macs += leaf.size * (50 - leaf.shape[0] + 1 if "conv" in name else 2 if name == "['softmax_kernel']" else 1)
    return macs


@pytest.mark.parametrize("arch", ["bilm", "awd_lstm"])
def test_perplexity_evaluation_counts_the_forward_flops_of_each_sentences_words(arch, monkeypatch):
    """Validation perplexity runs the LM once over each sentence: 2 x its MACs per word (from the
    parameter shapes) x the sentence's words with <S> and </S>; padding and the filler row of the
    short last batch are not counted."""
    import dataclasses

    from t5lite.models import get_config
    from t5lite.objectives.recurrent import AWDLSTMLMObjective
    vocab = word_vocab.build(TEXTS)
    _use_vocabulary(vocab, monkeypatch)
    length = 12
    if arch == "bilm":
        objective = BiLMObjective()
        config = BiLMConfig(filters=((1, 4), (2, 4)), char_embed_dim=4, n_highway=1, lstm_dim=8, projection_dim=4,
                            vocab_size=vocab.vocab_size)
        features = {"encoder_input_tokens": length, "encoder_input_chars": 50 * length}
    else:
        objective = AWDLSTMLMObjective()
        config = dataclasses.replace(get_config("awd_lstm_tiny"), vocab_size=vocab.vocab_size)
        features = {"encoder_input_tokens": length}
    module = objective.build_model(config)
    params = nn.unbox(module.init(jax.random.key(0), **objective.init_features(features)))["params"]
    evaluator = objective.evaluators(_Sentences(), "validation", {"targets": length}, batch_size=2)["sentences"]
    result = evaluator.evaluate(module, params)
    assert math.isfinite(result.metrics["perplexity"]) and result.num_examples() == len(TEXTS)
    words = sum(len(text.split()) + 2 for text in TEXTS)
    assert result.flops == pytest.approx(2 * _lm_macs_per_word_from_shapes(params) * words, rel=1e-12)
