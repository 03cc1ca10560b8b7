"""The word-level SST-2 classifiers learn: ULMFiT's AWD-LSTM classifier, frozen ELMo features + a
BiLSTM, and frozen static vectors + a BiLSTM each overfit a batch of real SST-2 sentences through
the objective trained by `t5lite train`, and the evaluator `t5lite train` scores them with gives
100% on those sentences. The evaluator's length buckets keep every word's 50 ELMo character ids;
the static table holds the vectors file's vector of each vocabulary word."""
from __future__ import annotations

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import shared_data_dir
from t5lite.data import catalog, converters, word_vocab
from t5lite.data.converter_registry import get_feature_converter
from t5lite.data.word_vectors import WordVectors, save_word2vec
from t5lite.interop import elmo
from t5lite.models.recurrent_config import AWDLSTMConfig, BiLMConfig
from t5lite.models.running_statistics import RUNNING_STATISTICS, with_running_statistics
from t5lite.objectives import recurrent as recurrent_objectives
from t5lite.objectives.recurrent import RecurrentClassificationObjective, WordClassificationEvaluator

ELMO = shared_data_dir() / "elmo"
LENGTHS = {"inputs": 24}
TINY_BILM = BiLMConfig(filters=((1, 8), (2, 8), (3, 16)), char_embed_dim=8, n_highway=1, lstm_dim=32,
                       projection_dim=16, vocab_size=0)
TINY_AWD = AWDLSTMConfig(vocab_size=0, emb_dim=32, hidden_dim=64, n_layers=2, embed_p=0.0, input_p=0.0, weight_p=0.0,
                         hidden_p=0.0, output_p=0.0)


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture
def sst2(tmp_path, monkeypatch):
    """32 real SST-2 training sentences (16 per label) as the `validation` split of a data dir, and
    a word vocabulary of their words."""
    lines = (shared_data_dir() / "glue" / "SST-2" / "train.tsv").read_text().splitlines()[1:]
    picked = [line for line in lines if line.endswith("\t0")][:16] + [line for line in lines if line.endswith("\t1")][:16]
    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(picked) + "\n")
    vocab = word_vocab.build([line.rsplit("\t", 1)[0] for line in picked], lowercase=True)
    from t5lite.data import word_converters
    for module in (word_converters, recurrent_objectives):
        monkeypatch.setattr(module, "word_vocabulary", lambda: vocab)
    return tmp_path, vocab


def _rows(objective, data_dir):
    task = catalog.get_task_or_mixture("bert_glue_sst2")
    examples = list(task.get_dataset("validation", LENGTHS, shuffle=False, data_dir=str(data_dir)))
    rows = list(get_feature_converter(WordClassificationEvaluator(task, "validation", LENGTHS, chars=objective.chars,
                                                                  data_dir=str(data_dir)).converter)
                .convert(examples, LENGTHS))
    return task, {k: jnp.asarray(np.stack([r[k] for r in rows])) for k in rows[0] if k != converters.EXAMPLES_KEY}


def _overfit(objective, config, data_dir, steps: int, learning_rate: float = 1e-2, grafted=None):
    """Adam on the objective's loss over the whole batch, from a fresh init with `grafted` params
    in place; (module, params, batch, task)."""
    task, batch = _rows(objective, data_dir)
    module = objective.build_model(config)
    features = {k: v for k, v in batch.items() if k != "label"}
    params = {**nn.unbox(module.init(jax.random.key(0), **features))["params"], **(grafted or {})}
    tx = optax.adam(learning_rate)
    state = tx.init(params)
    normalizers = objective.normalizers(batch, None)

    @jax.jit
    def step(params, state, rng):
        grads, sums = jax.grad(lambda p: objective.loss_and_metrics(module, p, batch, rng, normalizers, None),
                               has_aux=True)(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        if RUNNING_STATISTICS in sums:     # the AWD-LSTM head's BatchNorm, as the trainer stores it
            params = with_running_statistics(params, sums[RUNNING_STATISTICS])
        return params, state

    for i in range(steps):
        params, state = step(params, state, jax.random.key(i + 1))
    return module, params, batch, task


def _vectors_file(vocab, path, dim=16):
    words = tuple(vocab.words[3:])       # no specials: they stay zero rows
    vectors = np.random.default_rng(0).normal(size=(len(words), dim)).astype(np.float32)
    save_word2vec(WordVectors(words, vectors), path)
    return dict(zip(words, vectors))


@pytest.mark.parametrize("backbone", ["awd_lstm", "elmo", "static"])
def test_word_classifiers_overfit_real_sst2_sentences(backbone, sst2, tmp_path):
    data_dir, vocab = sst2
    if backbone == "static":
        _vectors_file(vocab, tmp_path / "vectors.txt")
        objective = RecurrentClassificationObjective(backbone="static", word_vectors=str(tmp_path / "vectors.txt"))
        config = TINY_AWD.replace(vocab_size=vocab.vocab_size)
    elif backbone == "elmo":     # the fixture's trained biLM: a frozen random one carries too little
        objective = RecurrentClassificationObjective(backbone="elmo")
        bilm, variables = elmo.load(str(ELMO / "options.json"), str(ELMO / "lm_weights.hdf5"))
        config, grafted = bilm.config.replace(vocab_size=vocab.vocab_size), {"bilm": variables["params"]}
    else:
        objective = RecurrentClassificationObjective(backbone="awd_lstm")
        config = TINY_AWD.replace(vocab_size=vocab.vocab_size)
    module, params, batch, task = _overfit(objective, config, data_dir, steps=60,
                                           grafted=grafted if backbone == "elmo" else None)
    features = {k: v for k, v in batch.items() if k != "label"}
    train_accuracy = float(np.mean(np.argmax(module.apply({"params": params}, **features), -1) == batch["label"][:, 0]))
    assert train_accuracy == 1.0
    evaluator = WordClassificationEvaluator(task, "validation", LENGTHS, chars=objective.chars, batch_size=8,
                                            data_dir=str(data_dir))
    assert evaluator.evaluate(module, params).metrics["accuracy"] == pytest.approx(100.0)


def test_elmo_evaluator_buckets_keep_every_words_characters(sst2):
    """Bucketed evaluation equals the model on the full rows (it once cut the flattened character
    ids at the word width, so ELMo saw one character id per word)."""
    data_dir, vocab = sst2
    objective = RecurrentClassificationObjective(backbone="elmo")
    task, batch = _rows(objective, data_dir)
    module = objective.build_model(TINY_BILM.replace(vocab_size=vocab.vocab_size))
    features = {k: v for k, v in batch.items() if k != "label"}
    params = nn.unbox(module.init(jax.random.key(0), **features))["params"]
    expected = np.asarray(module.apply({"params": params}, **features))
    evaluator = WordClassificationEvaluator(task, "validation", LENGTHS, chars=True, batch_size=8, length_buckets=4,
                                            data_dir=str(data_dir))
    (got,) = evaluator._outputs(module, params)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)


def test_static_table_rows_are_the_files_vectors(sst2, tmp_path):
    data_dir, vocab = sst2
    vectors = _vectors_file(vocab, tmp_path / "vectors.txt", dim=8)
    words = tuple(vocab.words) + ("Cased",)          # a word the file has only lowercased
    save_word2vec(WordVectors(tuple(vectors) + ("cased",), np.stack([*vectors.values(), np.ones(8)])),
                  tmp_path / "vectors.txt")
    table = recurrent_objectives.static_table(str(tmp_path / "vectors.txt"), words)
    assert table.shape == (vocab.vocab_size + 1, 8)
    np.testing.assert_array_equal(table[:4], 0.0)       # padding, </S>, <S>, <UNK>
    for word in list(vectors)[:20]:
        np.testing.assert_allclose(table[vocab.encode_tokens([word])[0]], vectors[word], rtol=1e-6)
    np.testing.assert_allclose(table[-1], 1.0)
