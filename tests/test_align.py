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


# Transcribed from facebookresearch/MUSE (commit 3159355): src/utils.py `get_nn_avg_dist` (its
# branch without faiss), src/dico_builder.py `get_candidates` (the csls_knn branch and what follows
# it) and `build_dictionary`, src/trainer.py `Trainer.build_dictionary` and `Trainer.procrustes`;
# logging and .cuda() left out.
try:
    import torch
except ImportError:     # the MUSE test skips
    torch = None

def muse_get_nn_avg_dist(emb, query, knn):
    bs = 1024
    all_distances = []
    emb = emb.transpose(0, 1).contiguous()
    for i in range(0, query.shape[0], bs):
        distances = query[i:i + bs].mm(emb)
        best_distances, _ = distances.topk(knn, dim=1, largest=True, sorted=True)
        all_distances.append(best_distances.mean(1).cpu())
    all_distances = torch.cat(all_distances)
    return all_distances.numpy()


def muse_get_candidates(emb1, emb2, params):
    bs = 128
    all_scores = []
    all_targets = []
    n_src = emb1.size(0)
    if params.dico_max_rank > 0 and not params.dico_method.startswith('invsm_beta_'):
        n_src = min(params.dico_max_rank, n_src)
    knn = int(params.dico_method[len('csls_knn_'):])
    average_dist1 = torch.from_numpy(muse_get_nn_avg_dist(emb2, emb1, knn))
    average_dist2 = torch.from_numpy(muse_get_nn_avg_dist(emb1, emb2, knn))
    average_dist1 = average_dist1.type_as(emb1)
    average_dist2 = average_dist2.type_as(emb2)
    for i in range(0, n_src, bs):
        scores = emb2.mm(emb1[i:min(n_src, i + bs)].transpose(0, 1)).transpose(0, 1)
        scores.mul_(2)
        scores.sub_(average_dist1[i:min(n_src, i + bs)][:, None] + average_dist2[None, :])
        best_scores, best_targets = scores.topk(2, dim=1, largest=True, sorted=True)
        all_scores.append(best_scores.cpu())
        all_targets.append(best_targets.cpu())
    all_scores = torch.cat(all_scores, 0)
    all_targets = torch.cat(all_targets, 0)
    all_pairs = torch.cat([torch.arange(0, all_targets.size(0)).long().unsqueeze(1),
                           all_targets[:, 0].unsqueeze(1)], 1)
    assert all_scores.size() == all_pairs.size() == (n_src, 2)
    diff = all_scores[:, 0] - all_scores[:, 1]
    reordered = diff.sort(0, descending=True)[1]
    all_scores = all_scores[reordered]
    all_pairs = all_pairs[reordered]
    if params.dico_max_rank > 0:
        selected = all_pairs.max(1)[0] <= params.dico_max_rank
        mask = selected.unsqueeze(1).expand_as(all_scores).clone()
        all_scores = all_scores.masked_select(mask).view(-1, 2)
        all_pairs = all_pairs.masked_select(mask).view(-1, 2)
    if params.dico_max_size > 0:
        all_scores = all_scores[:params.dico_max_size]
        all_pairs = all_pairs[:params.dico_max_size]
    diff = all_scores[:, 0] - all_scores[:, 1]
    if params.dico_min_size > 0:
        diff[:params.dico_min_size] = 1e9
    if params.dico_threshold > 0:
        mask = diff > params.dico_threshold
        mask = mask.unsqueeze(1).expand_as(all_pairs).clone()
        all_pairs = all_pairs.masked_select(mask).view(-1, 2)
    return all_pairs


def muse_build_dictionary(src_emb, tgt_emb, params):
    s2t_candidates = muse_get_candidates(src_emb, tgt_emb, params)
    t2s_candidates = muse_get_candidates(tgt_emb, src_emb, params)
    t2s_candidates = torch.cat([t2s_candidates[:, 1:], t2s_candidates[:, :1]], 1)
    s2t_candidates = set([(a, b) for a, b in s2t_candidates.numpy()])
    t2s_candidates = set([(a, b) for a, b in t2s_candidates.numpy()])
    assert params.dico_build == 'S2T&T2S'
    final_pairs = s2t_candidates & t2s_candidates
    return torch.LongTensor(list([[int(a), int(b)] for (a, b) in final_pairs]))


def muse_trainer_build_dictionary(mapping, src_weight, tgt_weight, params):
    src_emb = src_weight.mm(mapping.transpose(0, 1))     # self.mapping(self.src_emb.weight): nn.Linear, no bias
    tgt_emb = tgt_weight
    src_emb = src_emb / src_emb.norm(2, 1, keepdim=True).expand_as(src_emb)
    tgt_emb = tgt_emb / tgt_emb.norm(2, 1, keepdim=True).expand_as(tgt_emb)
    return muse_build_dictionary(src_emb, tgt_emb, params)


def muse_procrustes(src_weight, tgt_weight, dico):
    A = src_weight[dico[:, 0]]
    B = tgt_weight[dico[:, 1]]
    M = B.transpose(0, 1).mm(A).cpu().numpy()
    U, S, V_t = scipy.linalg.svd(M, full_matrices=True)
    return torch.from_numpy(U.dot(V_t)).type_as(src_weight)


MUSE_PARAMS = dict(dico_method="csls_knn_10", dico_build="S2T&T2S", dico_threshold=0, dico_max_rank=150,
                   dico_min_size=0, dico_max_size=0)


def _glove_and_a_noisy_rotation(tmp_path):
    """Real GloVe vectors (600 words) and a rotation of them with noise, its rows in another order."""
    from conftest import write_glove
    glove = load_word_vectors(write_glove(tmp_path / "glove.txt", 600))
    rng = np.random.default_rng(5)
    order = np.argsort(np.arange(600) + rng.normal(scale=60, size=600))
    rotation, _ = np.linalg.qr(rng.normal(size=(50, 50)))
    y = (glove.vectors @ rotation + 0.3 * rng.normal(size=(600, 50)))[order]
    return glove, WordVectors(tuple(glove.words[i] for i in order), y.astype(np.float32))


def test_refinement_dictionaries_and_maps_equal_muses(tmp_path):
    """MUSE's dictionaries (CSLS neighbourhoods over the whole vocabularies, only the queries and
    candidates cut to the 150 most frequent words) and the maps of two refinement rounds, from a
    Procrustes map on 30 identical-string pairs of real GloVe vectors."""
    pytest.importorskip("torch", reason="MUSE runs in PyTorch")
    from types import SimpleNamespace
    params = SimpleNamespace(**MUSE_PARAMS)
    source, target = _glove_and_a_noisy_rotation(tmp_path)
    w = align.fit(source, target, align.identical_strings(source, target)[:30], normalize=False)
    src, tgt = torch.from_numpy(source.vectors), torch.from_numpy(target.vectors)
    mapping = torch.from_numpy(w.T.astype(np.float32))
    dico = muse_trainer_build_dictionary(mapping, src, tgt, params)
    got = align._mutual_nearest(source.vectors @ w, target.vectors, 10, 150)
    assert got == sorted(map(tuple, dico.tolist())) and 30 < len(got) < 150
    narrowed = muse_trainer_build_dictionary(mapping, src[:151], tgt[:151], params)   # only the top words
    assert set(map(tuple, narrowed.tolist())) != set(got)
    for _ in range(2):
        mapping = muse_procrustes(src, tgt, muse_trainer_build_dictionary(mapping, src, tgt, params))
    # MUSE takes the SVD in float32: agreement to its precision
    np.testing.assert_allclose(align.refine(source, target, w, rounds=2, max_rank=150), mapping.numpy().T, atol=1e-4)


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
