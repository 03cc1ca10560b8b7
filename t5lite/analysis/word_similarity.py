"""Intrinsic evaluation of static word vectors: nearest words, analogies (3CosAdd, word2vec's
questions-words) and word-pair similarity (WordSim-353, SimLex-999), as gensim scores them.

Both evaluations look only at the first `restrict_vocab` rows (the most frequent words in released
files) and, by default, compare words case-insensitively; a question with a word outside that
vocabulary is skipped and counted as out of vocabulary."""
from __future__ import annotations

import numpy as np
from etils import epath

from t5lite import metrics
from t5lite.data.word_vectors import WordVectors
from t5lite.errors import DataError


def most_similar(vectors: WordVectors, positive=(), negative=(), topn: int = 10,
                 restrict_vocab: int | None = None) -> list[tuple[str, float]]:
    """The words nearest (cosine) to the mean of the unit vectors of `positive` minus those of
    `negative`, the query words left out: `most_similar(v, ["king", "woman"], ["man"])`."""
    missing = [w for w in (*positive, *negative) if w not in vectors]
    if missing:
        raise DataError(f"{', '.join(map(repr, missing))} not in the word vectors' vocabulary")
    return _nearest(vectors.unit()[:restrict_vocab], vectors.words, [vectors.index[w] for w in positive],
                    [vectors.index[w] for w in negative], topn)


def _nearest(unit: np.ndarray, words, positive: list[int], negative: list[int], topn: int):
    query = (unit[positive].sum(0) - unit[negative].sum(0)) / (len(positive) + len(negative))
    query = query / (np.linalg.norm(query) or 1.0)
    scores = unit @ query
    excluded = set(positive) | set(negative)
    wanted = min(topn + len(excluded), len(scores))
    best = np.argpartition(-scores, wanted - 1)[:wanted]           # the top rows without sorting them all
    best = best[np.argsort(-scores[best], kind="stable")]
    return [(words[i], float(scores[i])) for i in best if i not in excluded][:topn]


def _vocabulary(vectors: WordVectors, restrict_vocab: int, case_insensitive: bool) -> dict[str, int]:
    """Word (upper-cased when case-insensitive) -> row among the first rows; the most frequent spelling wins."""
    fold = str.upper if case_insensitive else str
    vocab = {}
    for i, word in enumerate(vectors.words[:restrict_vocab]):
        vocab.setdefault(fold(word), i)
    return vocab


def _lines(path):
    path = epath.Path(path)
    if not path.exists():
        raise DataError(f"evaluation file {path} does not exist")
    return path.read_bytes().decode("utf-8", errors="replace").splitlines()


def evaluate_analogies(vectors: WordVectors, questions_file, restrict_vocab: int = 300_000,
                       case_insensitive: bool = True) -> dict:
    """Accuracy on `a b c d` questions ("man king woman queen"), grouped in `: section` blocks: the
    answer is the nearest word to b - a + c among the first `restrict_vocab` words, a, b and c excluded."""
    vocab = _vocabulary(vectors, restrict_vocab, case_insensitive)
    fold = str.upper if case_insensitive else str
    unit, words = vectors.unit()[:restrict_vocab], vectors.words[:restrict_vocab]
    sections, oov, total = [], 0, 0
    for line in _lines(questions_file):
        if line.startswith(": "):
            sections.append({"section": line[2:].strip(), "correct": 0, "incorrect": 0})
            continue
        quad = [fold(word) for word in line.split()]
        if len(quad) != 4:
            continue
        if not sections:
            raise DataError(f"{questions_file}: questions before the first ': section' line")
        total += 1
        if any(word not in vocab for word in quad):
            oov += 1
            continue
        a, b, c, expected = quad
        ignore = {a, b, c}
        guesses = _nearest(unit, words, [vocab[b], vocab[c]], [vocab[a]], topn=5)
        predicted = next((g for g in (fold(w) for w, _ in guesses) if g in vocab and g not in ignore), None)
        sections[-1]["correct" if predicted == expected else "incorrect"] += 1
    correct = sum(s["correct"] for s in sections)
    answered = correct + sum(s["incorrect"] for s in sections)
    return {"accuracy": correct / answered if answered else float("nan"), "correct": correct,
            "answered": answered, "oov_ratio": oov / total if total else float("nan"), "sections": sections}


def evaluate_word_pairs(vectors: WordVectors, pairs_file, delimiter: str = "\t", restrict_vocab: int = 300_000,
                        case_insensitive: bool = True) -> dict:
    """Pearson and Spearman correlation (x100, as T5's metrics) between human scores and cosine
    similarity on `word1<TAB>word2<TAB>score` lines; `#` lines are comments."""
    vocab = _vocabulary(vectors, restrict_vocab, case_insensitive)
    fold = str.upper if case_insensitive else str
    unit = vectors.unit()
    gold, model, oov = [], [], 0
    for line in _lines(pairs_file):
        if not line or line.startswith("#"):
            continue
        fields = line.split(delimiter)
        try:
            a, b, score = fold(fields[0]), fold(fields[1]), float(fields[2])
        except (IndexError, ValueError):
            continue
        if len(fields) != 3:
            continue
        if a not in vocab or b not in vocab:
            oov += 1
            continue
        gold.append(score)
        model.append(float(unit[vocab[a]] @ unit[vocab[b]]))
    if not gold:
        raise DataError(f"{pairs_file}: no scored word pair with both words in the vocabulary; "
                        "is it `word1<TAB>word2<TAB>score`?")
    return {**metrics.pearson_corrcoef(gold, model), **metrics.spearman_corrcoef(gold, model),
            "pairs": len(gold), "oov_ratio": oov / (len(gold) + oov)}
