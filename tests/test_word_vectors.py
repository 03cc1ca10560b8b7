"""Static word vectors: the word2vec/GloVe file formats, nearest words, analogies and word-pair
similarity, each against gensim's KeyedVectors on real files (gensim's test data, GloVe 6B 50-d)."""
import numpy as np
import pytest

from conftest import assert_close, write_glove
from t5lite.analysis import word_similarity
from t5lite.data.word_vectors import WordVectors, load_word_vectors, save_word2vec
from t5lite.errors import DataError

gensim_utils = pytest.importorskip("gensim.test.utils", reason="gensim is the reference for word vectors")
from gensim.models import KeyedVectors  # noqa: E402

CRIME_TEXT = gensim_utils.datapath("crime-and-punishment.vec")
WORD2VEC_BINARY = gensim_utils.datapath("euclidean_vectors.bin")


@pytest.fixture(scope="module")
def glove(tmp_path_factory):
    """The first 20,000 GloVe 6B 50-d vectors as a GloVe text file (no header), and gensim's view of it."""
    path = write_glove(tmp_path_factory.mktemp("glove") / "glove.20k.50d.txt", 20_000)
    return path, KeyedVectors.load_word2vec_format(str(path), no_header=True)


def assert_same_vectors(ours: WordVectors, theirs):
    assert list(ours.words) == theirs.index_to_key
    assert_close(ours.vectors, theirs.vectors, rtol=1e-6)


@pytest.mark.parametrize("path,binary", [(CRIME_TEXT, False), (WORD2VEC_BINARY, True)])
def test_word2vec_text_and_binary_load_as_gensim_loads_them(path, binary):
    assert_same_vectors(load_word_vectors(path), KeyedVectors.load_word2vec_format(path, binary=binary))
    assert len(load_word_vectors(path, limit=7)) == 7


def test_glove_text_loads_as_gensim_loads_it(glove):
    path, theirs = glove
    assert_same_vectors(load_word_vectors(path), theirs)


@pytest.mark.parametrize("binary", [False, True])
def test_saved_word2vec_files_read_back_in_gensim(tmp_path, binary):
    ours = load_word_vectors(CRIME_TEXT, limit=50)
    out = tmp_path / ("v.bin" if binary else "v.txt")
    save_word2vec(ours, out, binary=binary)
    assert_same_vectors(ours, KeyedVectors.load_word2vec_format(str(out), binary=binary))


def test_most_similar_equals_gensim(glove):
    path, theirs = glove
    ours = load_word_vectors(path)
    for positive, negative in ((["king", "woman"], ["man"]), (["paris"], []), (["good", "bad"], ["worse"])):
        expected = theirs.most_similar(positive=positive, negative=negative, topn=10)
        got = word_similarity.most_similar(ours, positive, negative, topn=10)
        assert [w for w, _ in got] == [w for w, _ in expected]
        assert_close([s for _, s in got], [s for _, s in expected], rtol=1e-5)


def test_analogy_accuracy_equals_gensims_evaluate_word_analogies(glove, tmp_path):
    """The first 25 questions of each section of word2vec's questions-words.txt (all of it in the docs)."""
    path, theirs = glove
    sections, kept = {}, []
    for line in open(gensim_utils.datapath("questions-words.txt")):
        if line.startswith(": "):
            current = line
            sections[current] = 0
            kept.append(line)
        elif sections[current] < 25:
            sections[current] += 1
            kept.append(line)
    questions = tmp_path / "questions.txt"
    questions.write_text("".join(kept))
    score, their_sections = theirs.evaluate_word_analogies(str(questions), restrict_vocab=20_000)
    ours = word_similarity.evaluate_analogies(load_word_vectors(path), questions, restrict_vocab=20_000)
    assert ours["accuracy"] == pytest.approx(score, rel=1e-12)
    assert [s["correct"] for s in ours["sections"]] == [len(s["correct"]) for s in their_sections[:-1]]
    assert 0.3 < ours["accuracy"] < 0.9


@pytest.mark.parametrize("name", ["wordsim353.tsv", "simlex999.txt"])
def test_word_pair_similarity_equals_gensims_evaluate_word_pairs(glove, name):
    path, theirs = glove
    pearson, spearman, oov = theirs.evaluate_word_pairs(gensim_utils.datapath(name), restrict_vocab=20_000)
    ours = word_similarity.evaluate_word_pairs(load_word_vectors(path), gensim_utils.datapath(name),
                                               restrict_vocab=20_000)
    assert ours["spearman_corrcoef"] == pytest.approx(100 * spearman.statistic, rel=1e-6)
    assert ours["pearson_corrcoef"] == pytest.approx(100 * pearson.statistic, rel=1e-6)
    assert ours["oov_ratio"] == pytest.approx(oov / 100, rel=1e-12)


def test_bad_files_say_what_is_wrong(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_word_vectors(tmp_path / "missing.txt")
    ragged = tmp_path / "ragged.txt"
    ragged.write_text("a 1 2 3\nb 1 2\n")
    with pytest.raises(DataError, match="line 2 has 2 numbers, not 3"):
        load_word_vectors(ragged)
    truncated = tmp_path / "short.bin"
    save_word2vec(load_word_vectors(CRIME_TEXT, limit=5), truncated, binary=True)
    truncated.write_bytes(truncated.read_bytes()[:-10])
    with pytest.raises(DataError, match="truncated"):
        load_word_vectors(truncated)
    with pytest.raises(DataError, match="line 1 is not a `count dim` header"):
        load_word_vectors(gensim_utils.datapath("crime-and-punishment.bin"))    # a fastText model
    with pytest.raises(DataError, match="word2vec_binary"):
        load_word_vectors(CRIME_TEXT, format="fasttext")
    with pytest.raises(DataError, match="not in the word vectors' vocabulary"):
        word_similarity.most_similar(load_word_vectors(CRIME_TEXT), ["zzzz-not-a-word"])
