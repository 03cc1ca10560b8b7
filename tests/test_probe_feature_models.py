"""`t5lite probe` on the feature-based models the contextual ones are compared with: an ELMo run
(the fixture biLM converted with `elmo.to_run`), whose layers are `t5lite.interop.elmo.embed`'s, and
static word vectors (a GloVe text file of real GloVe 6B 50-d rows), one layer: each word's vector,
as written, else lowercased, else zeros. Each probe's accuracy per layer equals scikit-learn's
LogisticRegression (C = 1 / (l2 n)) on those vectors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_cli, shared_data_dir, write_glove
from t5lite.analysis import words
from t5lite.data.tasks.tagging import UPOS_TAGS
from t5lite.interop import elmo

sklearn = pytest.importorskip("sklearn.linear_model", reason="scikit-learn is the reference probe")
UD = shared_data_dir() / "ud"
ELMO = shared_data_dir() / "elmo"
L2 = 1e-3   # `t5lite probe`'s default --l2


def _sklearn_accuracy(train, test, train_vectors, test_vectors) -> float:
    tags = {t: i for i, t in enumerate(UPOS_TAGS)}
    y_train = [tags[t] for s in train for t in s.tags]
    y_test = np.array([tags[t] for s in test for t in s.tags])
    fit = sklearn.LogisticRegression(C=1 / (L2 * len(y_train)), tol=1e-10, max_iter=10000)
    fit.fit(np.concatenate(train_vectors).astype(np.float64), y_train)
    return float(np.mean(fit.predict(np.concatenate(test_vectors).astype(np.float64)) == y_test))


def _ud(train: int, test: int):
    return (words.read_conll(str(UD / "en_ewt" / "en_ewt-ud-train.conllu"), train),
            words.read_conll(str(UD / "en_ewt" / "en_ewt-ud-test.conllu"), test))


def test_a_glove_file_is_probed_as_one_layer_of_its_vectors(tmp_path, capsys):
    glove = write_glove(tmp_path / "glove.txt", 20000)
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, "probe", "--model", str(glove), "--data_dir", str(UD), "--probes", "pos",
                           "--train_sentences", "80", "--test_sentences", "40", "--out", str(out))
    assert code == 0, err
    result = json.loads((out / "probe.json").read_text())["pos"]
    # the reference table: the file read line by line, each word as written, else lowercased, else zeros
    table = {line.split(" ")[0]: np.array(line.split(" ")[1:], np.float32) for line in glove.read_text().splitlines()}
    train, test = _ud(80, 40)
    vector = lambda w: table.get(w, table.get(w.lower(), np.zeros(50, np.float32)))
    want = _sklearn_accuracy(train, test, *([np.stack([vector(w) for w in s.words]) for s in part] for part in (train, test)))
    got = result["glove.txt"]["accuracy"]
    n_test = sum(len(s.words) for s in test)
    assert len(got) == 1 and got[0] == pytest.approx(want, abs=1.5 / n_test)
    control = result["glove.txt (untrained)"]["accuracy"]
    assert len(control) == 1 and control[0] < got[0]   # random vectors for the same words: word identity alone
    from t5lite.analysis import probe
    ax = probe.figure(json.loads((out / "probe.json").read_text())).axes[0]
    low, high = ax.get_xlim()
    assert [t for t in ax.get_xticks() if low <= t <= high] == [0]   # one layer, one tick: no fractional layers


def test_an_elmo_run_is_probed_layer_by_layer(tmp_path, capsys):
    run = tmp_path / "elmo_run"
    elmo.to_run(str(ELMO / "options.json"), str(ELMO / "lm_weights.hdf5"), str(run))
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, "probe", "--model", str(run), "--data_dir", str(UD), "--probes", "pos",
                           "--train_sentences", "40", "--test_sentences", "20", "--out", str(out))
    assert code == 0, err
    result = json.loads((out / "probe.json").read_text())["pos"]
    module, variables = elmo.load(str(ELMO / "options.json"), str(ELMO / "lm_weights.hdf5"))
    train, test = _ud(40, 20)
    states = [elmo.embed(module, variables, [s.words for s in part]) for part in (train, test)]
    n_test = sum(len(s.words) for s in test)
    got = result["elmo_run"]["accuracy"]
    assert len(got) == 3 and len(result["elmo_run (untrained)"]["accuracy"]) == 3   # char-CNN, then two biLSTM layers
    for layer in range(3):
        want = _sklearn_accuracy(train, test, *([h[layer] for h in part] for part in states))
        assert got[layer] == pytest.approx(want, abs=1.5 / n_test), layer


def test_static_vectors_have_no_neighbours_or_attention(tmp_path, capsys):
    glove = write_glove(tmp_path / "glove.txt", 100)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("we play a game .\n")
    for args in (("probe", "--neighbours", "play", "--corpus", str(corpus)), ("attention", "--data_dir", str(UD))):
        code, _, err = run_cli(capsys, *args, "--model", str(glove), "--out", str(tmp_path / "out"))
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"--model {glove} is a file" in err and "`t5lite probe` also reads a word2vec or GloVe file" in err
