"""Embedding-space alignment against scipy, gensim's TranslationMatrix on its en/it test vectors,
and a numpy re-derivation of MUSE's CSLS."""
import numpy as np
import pytest
import scipy.linalg

from conftest import assert_close
from t5lite.analysis import align
from t5lite.data.word_vectors import WordVectors, load_word_vectors
from t5lite.errors import DataError

gensim_utils = pytest.importorskip("gensim.test.utils", reason="gensim's en/it vectors are the reference data")
from gensim.models import KeyedVectors, translation_matrix  # noqa: E402

EN = gensim_utils.datapath("EN.1-10.cbow1_wind5_hs0_neg10_size300_smpl1e-05.txt")
IT = gensim_utils.datapath("IT.1-10.cbow1_wind5_hs0_neg10_size300_smpl1e-05.txt")
DICTIONARY = gensim_utils.datapath("OPUS_en_it_europarl_train_one2ten.txt")


def test_procrustes_equals_scipy_and_is_orthogonal():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 8)), rng.normal(size=(40, 8))
    w = align.procrustes(x, y)
    reference, _ = scipy.linalg.orthogonal_procrustes(x, y)
    assert_close(w, reference, rtol=1e-9)
    assert_close(w.T @ w, np.eye(8), rtol=1e-10)


def test_procrustes_recovers_a_rotation():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(100, 6))
    rotation, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    assert_close(align.procrustes(x, x @ rotation), rotation, rtol=1e-10)


def test_linear_map_and_translation_equal_gensims_translation_matrix():
    en, it = load_word_vectors(EN), load_word_vectors(IT)
    pairs = align.read_dictionary(DICTIONARY)[:15]
    w = align.fit(en, it, pairs, method="linear")
    model = translation_matrix.TranslationMatrix(KeyedVectors.load_word2vec_format(EN),
                                                 KeyedVectors.load_word2vec_format(IT), pairs)
    assert_close(w, model.translation_matrix, rtol=1e-5)
    words = ["dog", "one", "apple", "banana", "ten"]
    theirs = model.translate(words, topn=3, source_lang_vec=model.source_lang_vec,
                             target_lang_vec=model.target_lang_vec)
    assert align.translate(en, it, w, words, topn=3, method="nn") == {w_: list(t) for w_, t in theirs.items()}


def numpy_csls(x, y, k):
    """MUSE's CSLS written out: 2 cos - mean of the k best cosines of each side."""
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    yn = y / np.linalg.norm(y, axis=1, keepdims=True)
    cos = xn @ yn.T
    r_x = np.sort(cos, axis=1)[:, ::-1][:, :k].mean(1)
    r_y = np.sort(cos.T, axis=1)[:, ::-1][:, :k].mean(1)
    return 2 * cos - r_x[:, None] - r_y[None, :]


def test_csls_equals_a_numpy_re_derivation():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(30, 5)), rng.normal(size=(25, 5))
    assert_close(align.csls(x, y, k=10), numpy_csls(x, y, 10), rtol=1e-9)
    assert_close(align.csls(x, y, k=100), numpy_csls(x, y, 100), rtol=1e-9)


def test_csls_translation_ranks_by_the_csls_scores():
    rng = np.random.default_rng(3)
    source = WordVectors(tuple(f"s{i}" for i in range(50)), rng.normal(size=(50, 4)).astype(np.float32))
    target = WordVectors(tuple(f"t{i}" for i in range(40)), rng.normal(size=(40, 4)).astype(np.float32))
    w = np.eye(4)
    expected = numpy_csls(source.vectors.astype(np.float64), target.vectors.astype(np.float64), 10)
    ranked = align.translate(source, target, w, ["s3", "s17"], topn=4, method="csls")
    for word, row in (("s3", 3), ("s17", 17)):
        assert ranked[word] == [f"t{j}" for j in np.argsort(-expected[row], kind="stable")[:4]]


def test_refinement_recovers_a_hidden_rotation_from_a_small_identical_string_seed():
    """Target = rotated source plus noise, every word renamed but ten: Procrustes on that seed alone
    retrieves few translations, MUSE's refinement recovers the rotation (P@1 near 1), and the
    least-squares map from the same seed stays between the two."""
    rng = np.random.default_rng(4)
    n, d = 300, 20
    x = rng.normal(size=(n, d))
    rotation, _ = np.linalg.qr(rng.normal(size=(d, d)))
    y = x @ rotation + 0.05 * rng.normal(size=(n, d))
    shared = set(range(0, n, 30))
    source = WordVectors(tuple(f"w{i}" for i in range(n)), x.astype(np.float32))
    target = WordVectors(tuple(f"w{i}" if i in shared else f"v{i}" for i in range(n)), y.astype(np.float32))
    seed = align.identical_strings(source, target)
    assert seed == [(f"w{i}", f"w{i}") for i in sorted(shared)]
    test = [(f"w{i}", f"v{i}") for i in range(n) if i not in shared]

    def p_at_1(w, method):
        return align.precision_at_k(source, target, w, test, method=method)["precision_at_1"]

    seeded = align.fit(source, target, seed)
    refined = align.refine(source, target, seeded, rounds=3)
    linear = align.fit(source, target, seed, method="linear")
    assert p_at_1(seeded, "csls") < 0.5
    assert p_at_1(refined, "csls") > 0.95
    assert p_at_1(seeded, "csls") < p_at_1(linear, "nn") < p_at_1(refined, "nn")
    assert np.linalg.norm(refined - rotation) < 0.2 * np.linalg.norm(rotation)


def test_bad_inputs_name_the_fix(tmp_path):
    en = load_word_vectors(EN)
    with pytest.raises(DataError, match="'procrustes' or 'linear'"):
        align.fit(en, en, [("one", "one")], method="svd")
    with pytest.raises(DataError, match="no dictionary pair"):
        align.fit(en, en, [("nope", "none")])
    with pytest.raises(DataError, match="does not exist"):
        align.read_dictionary(tmp_path / "missing.txt")
    with pytest.raises(DataError, match="'nn' or 'csls'"):
        align.translate(en, en, np.eye(300), ["one"], method="cosine")
