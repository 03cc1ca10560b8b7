"""Aligning two embedding spaces (word translation without parallel text): Mikolov et al.'s (2013)
least-squares map, orthogonal Procrustes, CSLS retrieval and MUSE's refinement (Conneau et al. 2018).

Every map is a matrix W applied on the right: `x @ W ≈ y` for row vectors x of the source space and
y of the target space. The two spaces may differ in width for the least-squares map and Procrustes
(W is then semi-orthogonal)."""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
from etils import epath

from t5lite.data.word_vectors import WordVectors
from t5lite.errors import DataError


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms == 0, 1, norms)


def linear_map(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mikolov's translation matrix: the W minimising ||x W - y||^2 (least squares)."""
    return np.linalg.lstsq(np.asarray(x, np.float64), np.asarray(y, np.float64), rcond=None)[0]


def procrustes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The orthogonal W minimising ||x W - y||: U V^T from the SVD of x^T y."""
    u, _, vt = np.linalg.svd(np.asarray(x, np.float64).T @ np.asarray(y, np.float64), full_matrices=False)
    return u @ vt


def _mean_top_k(similarities: np.ndarray, k: int) -> np.ndarray:
    """Per row, the mean of its k largest entries (fewer when a row is shorter)."""
    k = min(k, similarities.shape[1])
    return np.mean(np.partition(similarities, -k, axis=1)[:, -k:], axis=1)


def csls(x: np.ndarray, y: np.ndarray, k: int = 10) -> np.ndarray:
    """Cross-domain similarity local scaling, [len(x), len(y)]: 2 cos(x, y) - r_y(x) - r_x(y), where
    r_y(x) is x's mean cosine to its k nearest y and r_x(y) y's to its k nearest x. It lowers the
    scores of hubs, the points that are near everything."""
    cosine = _unit(x) @ _unit(y).T
    return 2 * cosine - _mean_top_k(cosine, k)[:, None] - _mean_top_k(cosine.T, k)[None, :]


def identical_strings(source: WordVectors, target: WordVectors, limit: int | None = None) -> list[tuple[str, str]]:
    """A seed dictionary of the words spelled the same in both vocabularies, in source order."""
    return [(w, w) for w in source.words[:limit] if w in target.index]


def read_dictionary(path) -> list[tuple[str, str]]:
    """A bilingual dictionary file: one `source target` pair per line (MUSE's and gensim's layout)."""
    path = epath.Path(path)
    if not path.exists():
        raise DataError(f"dictionary {path} does not exist")
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if len(fields) == 2:
            pairs.append((fields[0], fields[1]))
    if not pairs:
        raise DataError(f"dictionary {path} holds no `source target` lines")
    return pairs


def _pair_rows(source: WordVectors, target: WordVectors, pairs: Iterable[tuple[str, str]]):
    kept = [(source.index[s], target.index[t]) for s, t in pairs if s in source.index and t in target.index]
    if not kept:
        raise DataError("no dictionary pair has both words in the two vocabularies")
    return np.array(kept).T


def fit(source: WordVectors, target: WordVectors, pairs, method: str = "procrustes",
        normalize: bool = True) -> np.ndarray:
    """The map from `source` to `target` learned on dictionary `pairs` by "procrustes" or "linear";
    `normalize` scales every vector to unit length first (as gensim's TranslationMatrix does)."""
    rows_s, rows_t = _pair_rows(source, target, pairs)
    x, y = (source.unit(), target.unit()) if normalize else (source.vectors, target.vectors)
    if method == "procrustes":
        return procrustes(x[rows_s], y[rows_t])
    if method == "linear":
        return linear_map(x[rows_s], y[rows_t])
    raise DataError(f"alignment method {method!r} is unknown; use 'procrustes' or 'linear'")


def _neighbourhood(queries: np.ndarray, keys: np.ndarray, k: int, chunk: int = 1024) -> np.ndarray:
    """Per unit query row, its mean cosine to its k nearest unit key rows, in chunks (vocabularies are large)."""
    return np.concatenate([_mean_top_k(queries[i:i + chunk] @ keys.T, k) for i in range(0, len(queries), chunk)])


def _csls_argmax(queries: np.ndarray, keys: np.ndarray, r_queries: np.ndarray, r_keys: np.ndarray,
                 chunk: int = 1024) -> np.ndarray:
    """Per unit query row, the key row of best CSLS, in chunks (never the whole score matrix)."""
    return np.concatenate([np.argmax(2 * queries[i:i + chunk] @ keys.T - r_queries[i:i + chunk, None] - r_keys[None],
                                     axis=1) for i in range(0, len(queries), chunk)])


def _candidates(queries: np.ndarray, keys: np.ndarray, r_queries: np.ndarray, r_keys: np.ndarray,
                max_rank: int) -> set[tuple[int, int]]:
    """MUSE's `get_candidates` (csls_knn_k): each of the first `max_rank` queries with its best key
    by CSLS among all keys, kept where the key's 0-based row is at most `max_rank` (MUSE's `<=`)."""
    n = min(max_rank, len(queries))
    best = _csls_argmax(queries[:n], keys, r_queries[:n], r_keys)
    return {(i, int(j)) for i, j in enumerate(best) if j <= max_rank}


def _mutual_nearest(mapped: np.ndarray, target: np.ndarray, k: int, max_rank: int) -> list[tuple[int, int]]:
    """MUSE's `build_dictionary` with S2T&T2S: the pairs (i, j) where j is source i's candidate and i
    target j's. The CSLS neighbourhoods are over the whole vocabularies (MUSE's `get_nn_avg_dist`
    on the full embeddings); `max_rank` limits only the queries and the candidates kept."""
    mapped, target = _unit(mapped).astype(np.float32), _unit(target).astype(np.float32)
    r_source, r_target = _neighbourhood(mapped, target, k), _neighbourhood(target, mapped, k)
    forward = _candidates(mapped, target, r_source, r_target, max_rank)
    backward = {(i, j) for j, i in _candidates(target, mapped, r_target, r_source, max_rank)}
    return sorted(forward & backward)


def refine(source: WordVectors, target: WordVectors, w: np.ndarray, rounds: int = 5, max_rank: int = 15_000,
           k: int = 10, normalize: bool = False) -> np.ndarray:
    """MUSE's refinement: from the current map, build a dictionary of mutual CSLS nearest neighbours
    among the `max_rank` most frequent words of each side (`_mutual_nearest`), refit Procrustes on
    it, `rounds` times. Procrustes reads the vectors as given, as MUSE does (its
    `--normalize_embeddings` is empty by default); `normalize` fits unit vectors instead, as `fit`
    does by default. MUSE's supervised.py builds its dictionaries the same way (S2T&T2S) with
    `--dico_max_rank` 10000; `max_rank` follows unsupervised.py's and the paper's 15000."""
    x, y = (source.unit(), target.unit()) if normalize else (source.vectors, target.vectors)
    for _ in range(rounds):
        pairs = _mutual_nearest(x @ w, y, k, max_rank)
        if not pairs:
            break
        rows_s, rows_t = np.array(pairs).T
        w = procrustes(x[rows_s], y[rows_t])
    return w


def translate(source: WordVectors, target: WordVectors, w: np.ndarray, words: Sequence[str], topn: int = 5,
              method: str = "nn", k: int = 10) -> dict[str, list[str]]:
    """Each source word's `topn` target words under the map, by cosine or CSLS over the whole target
    vocabulary (CSLS's target neighbourhoods are taken among all mapped source words, as MUSE does)."""
    missing = [word for word in words if word not in source.index]
    if missing:
        raise DataError(f"{', '.join(map(repr, missing))} not in the source vocabulary")
    if method not in ("nn", "csls"):
        raise DataError(f"retrieval method {method!r} is unknown; use 'nn' or 'csls'")
    mapped, target_unit = _unit(source.unit() @ w).astype(np.float32), target.unit().astype(np.float32)
    cosine = mapped[[source.index[word] for word in words]] @ target_unit.T
    if method == "csls":
        cosine = 2 * cosine - _mean_top_k(cosine, k)[:, None] - _neighbourhood(target_unit, mapped, k)[None, :]
    best = np.argsort(-cosine, axis=1, kind="stable")[:, :topn]
    return {word: [target.words[j] for j in row] for word, row in zip(words, best)}


def precision_at_k(source: WordVectors, target: WordVectors, w: np.ndarray, test_pairs, ks=(1, 5),
                   method: str = "csls", k: int = 10) -> dict[str, float]:
    """MUSE's word-translation precision@k: the share of test source words with a correct
    translation (any listed target) among their k best-scored target words."""
    gold: dict[str, set[str]] = {}
    for s, t in test_pairs:
        if s in source.index and t in target.index:
            gold.setdefault(s, set()).add(t)
    if not gold:
        raise DataError("no test pair has both words in the two vocabularies")
    ranked = translate(source, target, w, list(gold), topn=max(ks), method=method, k=k)
    return {f"precision_at_{n}": float(np.mean([bool(gold[s] & set(ranked[s][:n])) for s in gold])) for n in ks}
