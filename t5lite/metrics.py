"""Evaluation metrics with the names, keys and conventions T5 registers for its tasks.

Every metric is `fn(targets, predictions) -> dict[str, float]` with values scaled x100, so
that numbers read like the tables in the T5 paper and match the keys T5X logs. Classification
and correlation metrics are plain numpy (and checked against scikit-learn / scipy in the
tests); BLEU and ROUGE call sacrebleu and rouge_score, because their tokenisation is the metric.
The two are imported lazily so that the rest of t5lite does not need them installed.

Which task uses what (as T5 registers it): cola -> matthews_corrcoef; sst2, mnli, qnli, rte,
wnli, boolq, copa, wic -> accuracy; mrpc, qqp -> f1_score_with_invalid + accuracy; stsb ->
pearson_corrcoef + spearman_corrcoef (predictions through string_to_float); squad -> squad;
cb -> mean_multiclass_f1(3) + accuracy; multirc -> multirc_f1_over_all_answers +
multirc_exact_match (or multirc_metrics for both); record -> record_metrics; wmt -> bleu;
summarisation -> rouge; tagging -> entity_f1 + token_accuracy (NER), token_accuracy (POS);
sentence-embedding retrieval (SQuAD, Multi30k) -> retrieval (recall@k, MRR@10, nDCG@10).
"""
from __future__ import annotations

import collections
import re
import string
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np

MetricFn = Callable[[Sequence[Any], Sequence[Any]], dict[str, float]]

__all__ = [
    "accuracy",
    "f1_score_with_invalid",
    "matthews_corrcoef",
    "pearson_corrcoef",
    "spearman_corrcoef",
    "string_to_float",
    "normalize_squad",
    "squad",
    "retrieval",
    "bleu",
    "rouge",
    "mean_multiclass_f1",
    "multirc_f1_over_all_answers",
    "multirc_exact_match",
    "multirc_metrics",
    "record_metrics",
    "entities",
    "entity_f1",
    "token_accuracy",
    "compute_metrics",
]


# ----------------------------------------------------------------------------- input checks

def _as_lists(name: str, targets: Iterable[Any], predictions: Iterable[Any]) -> tuple[list, list]:
    """Materialises both sides and rejects empty or misaligned inputs, naming the metric.

    An empty eval set would otherwise show up as a silent nan (or 0) in the logs.
    """
    targets, predictions = list(targets), list(predictions)
    if len(targets) != len(predictions):
        raise ValueError(f"{name}: got {len(targets)} targets but {len(predictions)} predictions")
    if not targets:
        raise ValueError(f"{name}: targets and predictions are empty")
    return targets, predictions


def _value(x: Any, key: str = "value") -> Any:
    """The payload of a SuperGLUE-style `{"group": ..., "value": ...}` dict, or `x` itself."""
    return x[key] if isinstance(x, Mapping) else x


# ----------------------------------------------------------------------------- classification

def accuracy(targets, predictions) -> dict[str, float]:
    """Percentage of exact matches; works for class ids and for strings alike."""
    targets, predictions = _as_lists("accuracy", targets, predictions)
    return {"accuracy": 100.0 * float(np.mean([t == p for t, p in zip(targets, predictions)]))}


def _is_binary_label(x: Any) -> bool:
    """True for 0/1 (ints, floats, bools, numpy scalars); False for -1, strings, None, nan."""
    try:
        return not isinstance(x, (str, bytes)) and x in (0, 1)
    except (TypeError, ValueError):
        return False


def _binary_f1(targets: Sequence[int], predictions: Sequence[int]) -> float:
    """F1 of the positive class (1); 0 when there are no positives at all, as sklearn does."""
    t, p = np.asarray(targets) == 1, np.asarray(predictions) == 1
    tp, fp, fn = np.sum(t & p), np.sum(~t & p), np.sum(t & ~p)
    denom = 2 * tp + fp + fn
    return float(2 * tp / denom) if denom else 0.0


def f1_score_with_invalid(targets, predictions) -> dict[str, float]:
    """Binary F1 where a prediction that is not 0/1 counts as the wrong class.

    The string-to-label postprocessor maps text the model should not have produced to -1;
    flipping it to `1 - target` charges it as an error without inventing a third class.
    """
    targets, predictions = _as_lists("f1_score_with_invalid", targets, predictions)
    bad = [t for t in targets if not _is_binary_label(t)]
    if bad:
        raise ValueError(f"f1_score_with_invalid: targets must be 0 or 1, got {bad[0]!r}")
    targets = [int(t) for t in targets]
    fixed = [int(p) if _is_binary_label(p) else 1 - t for t, p in zip(targets, predictions)]
    return {"f1": 100.0 * _binary_f1(targets, fixed)}


def _confusion(targets: Sequence[Hashable], predictions: Sequence[Hashable]) -> np.ndarray:
    """Confusion matrix (rows: target, columns: prediction) over every value seen.

    An invalid prediction (-1) thus becomes a class of its own, which is what T5's
    sklearn-based Matthews correlation does for cola.
    """
    index = {label: i for i, label in enumerate(dict.fromkeys([*targets, *predictions]))}
    matrix = np.zeros((len(index), len(index)), dtype=np.int64)
    for t, p in zip(targets, predictions):
        matrix[index[t], index[p]] += 1
    return matrix


def matthews_corrcoef(targets, predictions) -> dict[str, float]:
    """Matthews correlation (multi-class form); 0 when either side is constant, as sklearn."""
    targets, predictions = _as_lists("matthews_corrcoef", targets, predictions)
    c = _confusion(targets, predictions).astype(np.float64)
    n, correct = c.sum(), np.trace(c)
    true_counts, pred_counts = c.sum(axis=1), c.sum(axis=0)
    cov_tp = correct * n - true_counts @ pred_counts
    cov_tt = n * n - true_counts @ true_counts
    cov_pp = n * n - pred_counts @ pred_counts
    if cov_tt * cov_pp == 0:
        return {"matthews_corrcoef": 0.0}
    return {"matthews_corrcoef": 100.0 * float(cov_tp / np.sqrt(cov_tt * cov_pp))}


def _class_f1(targets: Sequence[Any], predictions: Sequence[Any], label: Any) -> float:
    """One-vs-rest F1 of `label`: 2TP / (#predicted + #true); 0 if it occurs on neither side.

    The 0 for an absent class is sklearn's zero_division default, and it still enters the mean.
    """
    tp = sum(t == label and p == label for t, p in zip(targets, predictions))
    denom = sum(p == label for p in predictions) + sum(t == label for t in targets)
    return 2.0 * tp / denom if denom else 0.0


def mean_multiclass_f1(num_classes: int) -> MetricFn:
    """Macro F1 over the classes 0..num_classes-1 (cb uses 3), as `mean_<n>class_f1`.

    Predictions outside 0..n-1 (invalid text -> -1) are misses for the true class and count
    for no class of their own.
    """
    if num_classes < 2:
        raise ValueError(f"mean_multiclass_f1: num_classes must be >= 2, got {num_classes}")
    key = f"mean_{num_classes}class_f1"

    def metric(targets, predictions) -> dict[str, float]:
        targets, predictions = _as_lists(key, targets, predictions)
        scores = [_class_f1(targets, predictions, label) for label in range(num_classes)]
        return {key: 100.0 * float(np.mean(scores))}

    metric.__name__ = metric.__qualname__ = key
    return metric


# ----------------------------------------------------------------------------- regression

def string_to_float(text: str | bytes, default: float = -1.0) -> float:
    """stsb postprocessor: the model's text as a float, `default` when it does not parse.

    -1 lies outside the 0..5 STS-B range, so unparseable output hurts the correlation.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    try:
        return float(text)
    except (TypeError, ValueError):
        return default


def _as_floats(name: str, targets, predictions) -> tuple[np.ndarray, np.ndarray]:
    targets, predictions = _as_lists(name, targets, predictions)
    return np.asarray(targets, dtype=np.float64), np.asarray(predictions, dtype=np.float64)


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson r; nan if either side is constant (r is undefined) or contains nan.

    Constancy is tested exactly, not via a zero variance, so rounding noise in the mean
    cannot turn a constant column into a spurious correlation.
    """
    if np.isnan(x).any() or np.isnan(y).any() or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    xc, yc = x - x.mean(), y - y.mean()
    r = (xc @ yc) / np.sqrt((xc @ xc) * (yc @ yc))
    return float(np.clip(r, -1.0, 1.0))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties sharing their average rank (what Spearman's rho needs)."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts_block = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
    starts = np.flatnonzero(starts_block)
    ends = np.r_[starts[1:], len(x)]
    block_rank = (starts + ends + 1) / 2.0          # mean of ranks starts+1 .. ends
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = block_rank[np.cumsum(starts_block) - 1]
    return ranks


def pearson_corrcoef(targets, predictions) -> dict[str, float]:
    """Pearson r x100 (stsb). nan for constant inputs (e.g. a model that always says "3.0")."""
    x, y = _as_floats("pearson_corrcoef", targets, predictions)
    return {"pearson_corrcoef": 100.0 * _pearson(x, y)}


def spearman_corrcoef(targets, predictions) -> dict[str, float]:
    """Spearman rho x100 (stsb): Pearson on average ranks. nan for constant or nan inputs."""
    x, y = _as_floats("spearman_corrcoef", targets, predictions)
    if np.isnan(x).any() or np.isnan(y).any():
        return {"spearman_corrcoef": float("nan")}
    return {"spearman_corrcoef": 100.0 * _pearson(_average_ranks(x), _average_ranks(y))}


# ----------------------------------------------------------------------------- retrieval

RECALL_AT = (1, 5, 10)
RANK_CUTOFF = 10   # MRR@10 and nDCG@10, as sentence-transformers' InformationRetrievalEvaluator


def retrieval(targets, predictions) -> dict[str, float]:
    """Ranked retrieval, x100: each target is the set of relevant document ids of a query, each
    prediction its ranked document ids (best first, at least RANK_CUTOFF when the corpus has
    them). recall@k: the share of a query's relevant documents in its top k; MRR@10: 1 / rank of
    the first relevant one (0 past 10); nDCG@10 with binary gains (1 / log2(rank + 1))."""
    targets, predictions = _as_lists("retrieval", targets, predictions)
    recall = {k: [] for k in RECALL_AT}
    mrr, ndcg = [], []
    for relevant, ranked in zip(targets, predictions):
        relevant = set(relevant)
        hits = np.array([doc in relevant for doc in list(ranked)[:max(*RECALL_AT, RANK_CUTOFF)]], bool)
        for k in RECALL_AT:
            recall[k].append(hits[:k].sum() / max(len(relevant), 1))
        top = hits[:RANK_CUTOFF]
        mrr.append(1.0 / (1 + int(np.argmax(top))) if top.any() else 0.0)
        discounts = 1.0 / np.log2(np.arange(2, RANK_CUTOFF + 2))
        ideal = discounts[:min(len(relevant), RANK_CUTOFF)].sum()
        ndcg.append(float(discounts[:len(top)][top].sum() / ideal) if ideal else 0.0)
    return {**{f"recall@{k}": 100.0 * float(np.mean(v)) for k, v in recall.items()},
            f"mrr@{RANK_CUTOFF}": 100.0 * float(np.mean(mrr)), f"ndcg@{RANK_CUTOFF}": 100.0 * float(np.mean(ndcg))}


# ----------------------------------------------------------------------------- SQuAD / ReCoRD

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_squad(text: str) -> str:
    """The official SQuAD answer normalisation: lowercase, drop punctuation and a/an/the,
    collapse whitespace. Order matters: punctuation goes before articles ("the-end" -> "theend").
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _token_f1(target: str, prediction: str, empty_matches: bool = False) -> float:
    """Bag-of-tokens F1 of two normalised answers.

    As in the SQuAD v1.1 script (and T5), no overlap gives 0 -- including empty vs empty,
    which still scores 1 on exact match. The v2.0 script (`empty_matches`) scores an empty
    answer 1 when both are empty: that is a correct "unanswerable".
    """
    pred_tokens, target_tokens = prediction.split(), target.split()
    if empty_matches and not (pred_tokens and target_tokens):
        return float(pred_tokens == target_tokens)
    overlap = sum((collections.Counter(pred_tokens) & collections.Counter(target_tokens)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred_tokens), overlap / len(target_tokens)
    return 2 * precision * recall / (precision + recall)


def _gold_answers(name: str, index: int, answers: Any, drop_empty: bool = False) -> list[str]:
    """A list of normalised gold answers; a bare string is one answer, an empty list an error.
    `drop_empty`: answers that normalise to "" are dropped unless all do (the v2.0 script's rule)."""
    answers = [answers] if isinstance(answers, str) else list(answers)
    if not answers:
        raise ValueError(f"{name}: example {index} has no gold answers")
    golds = [normalize_squad(a) for a in answers]
    return ([g for g in golds if g] or [""]) if drop_empty else golds


def _max_over_answers(name: str, targets, predictions, empty_matches: bool = False) -> dict[str, float]:
    """EM and F1 x100, each the best over an example's gold answers, averaged over examples."""
    targets, predictions = _as_lists(name, targets, predictions)
    em, f1 = [], []
    for i, (answers, prediction) in enumerate(zip(targets, predictions)):
        golds, pred = _gold_answers(name, i, answers, drop_empty=empty_matches), normalize_squad(prediction)
        em.append(max(float(g == pred) for g in golds))
        f1.append(max(_token_f1(g, pred, empty_matches) for g in golds))
    return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1))}


def squad(targets, predictions) -> dict[str, float]:
    """SQuAD EM/F1. Each target is the list of gold answers of one question."""
    return _max_over_answers("squad", targets, predictions)


def squad_v2(targets, predictions) -> dict[str, float]:
    """SQuAD 2.0 EM/F1 as the official v2.0 script scores them: as `squad`, but gold answers that
    normalise to "" are ignored, and an empty prediction for an unanswerable question ("" gold) scores F1 100."""
    return _max_over_answers("squad_v2", targets, predictions, empty_matches=True)


def _deduplicate(targets: list, predictions: list) -> tuple[list, list]:
    """Keeps the first example of each target "group" (ReCoRD repeats a query per answer)."""
    seen: set = set()
    kept_t, kept_p = [], []
    for t, p in zip(targets, predictions):
        if t["group"] in seen:
            continue
        seen.add(t["group"])
        kept_t.append(t["value"])
        kept_p.append(_value(p))
    return kept_t, kept_p


def record_metrics(targets, predictions) -> dict[str, float]:
    """ReCoRD EM/F1: SQuAD scoring, max over the answer entities.

    Targets are answer lists, or `{"group", "value": answers}` dicts; dict targets are
    de-duplicated by group first (T5's deduplicate_metric), so a query counts once.
    """
    targets, predictions = _as_lists("record_metrics", targets, predictions)
    if isinstance(targets[0], Mapping):
        targets, predictions = _deduplicate(targets, predictions)
    else:
        predictions = [_value(p) for p in predictions]
    return _max_over_answers("record_metrics", targets, predictions)


# ----------------------------------------------------------------------------- MultiRC

def _multirc_values(name: str, targets, predictions) -> tuple[list, list, list]:
    """(groups, target values, prediction values), checking that dict groups line up."""
    targets, predictions = _as_lists(name, targets, predictions)
    for i, (t, p) in enumerate(zip(targets, predictions)):
        if isinstance(p, Mapping) and "group" in p and p["group"] != t["group"]:
            raise ValueError(f"{name}: example {i} has target group {t['group']!r} "
                             f"but prediction group {p['group']!r}")
    return ([t["group"] for t in targets], [t["value"] for t in targets],
            [_value(p) for p in predictions])


def _group_exact_match(groups: list, targets: list, predictions: list) -> float:
    """Mean over groups of "every value in the group is right" (T5's mean_group_metric(all_match))."""
    all_right: dict[Hashable, bool] = {}
    for g, t, p in zip(groups, targets, predictions):
        all_right[g] = all_right.get(g, True) and t == p
    return 100.0 * float(np.mean(list(all_right.values())))


def multirc_f1_over_all_answers(targets, predictions) -> dict[str, float]:
    """MultiRC F1a: binary F1 (invalid = wrong) over every answer option, ignoring questions."""
    _, t, p = _multirc_values("multirc_f1_over_all_answers", targets, predictions)
    return f1_score_with_invalid(t, p)


def multirc_exact_match(targets, predictions) -> dict[str, float]:
    """MultiRC EM: share of questions ("group") whose answer options are all right."""
    groups, t, p = _multirc_values("multirc_exact_match", targets, predictions)
    return {"exact_match": _group_exact_match(groups, t, p)}


def multirc_metrics(targets, predictions) -> dict[str, float]:
    """Both MultiRC numbers under the SuperGLUE leaderboard names: exact_match and f1a."""
    groups, t, p = _multirc_values("multirc_metrics", targets, predictions)
    return {"exact_match": _group_exact_match(groups, t, p),
            "f1a": f1_score_with_invalid(t, p)["f1"]}


# ----------------------------------------------------------------------------- BLEU / ROUGE

def _reference_streams(targets: list) -> list[list[str | None]]:
    """Per-example references -> sacrebleu's reference streams (one list per reference slot).

    Examples with fewer references are padded with None, which sacrebleu skips.
    """
    per_example = [[t] if isinstance(t, str) else list(t) for t in targets]
    for i, refs in enumerate(per_example):
        if not refs:
            raise ValueError(f"bleu: example {i} has no references")
    width = max(len(refs) for refs in per_example)
    return [[refs[j] if j < len(refs) else None for refs in per_example] for j in range(width)]


def bleu(targets, predictions) -> dict[str, float]:
    """Corpus BLEU with T5's sacrebleu settings (intl tokenizer, exp smoothing, no lowercasing).

    A target may be one reference string or a list of references for that example.
    """
    import sacrebleu

    targets, predictions = _as_lists("bleu", targets, predictions)
    score = sacrebleu.corpus_bleu(
        predictions, _reference_streams(targets), smooth_method="exp", smooth_value=0.0,
        force=False, lowercase=False, tokenize="intl", use_effective_order=False)
    return {"bleu": float(score.score)}


def _split_sentences(summary: str) -> str:
    """T5's sentence split for rougeLsum: a newline after each space-separated " . "."""
    return summary.replace(" . ", " .\n")


def rouge(targets, predictions, score_keys: Sequence[str] = ("rouge1", "rouge2", "rougeLsum"),
          use_stemmer: bool = False) -> dict[str, float]:
    """ROUGE F-measures x100 as T5 computes them: the mid of rouge_score's bootstrap over examples.

    Like T5, no Porter stemming by default (`use_stemmer=True` gives the stemmed numbers many
    summarisation papers report, about a point higher). rougeLsum treats newlines as sentence
    boundaries; " . " is turned into one first, as T5 does. The bootstrap draws from numpy's global RNG, so seed it (np.random.seed) for
    bit-exact repeats; the mid value is within a hair of the plain mean either way.
    """
    from rouge_score import rouge_scorer, scoring

    targets, predictions = _as_lists("rouge", targets, predictions)
    scorer = rouge_scorer.RougeScorer(list(score_keys), use_stemmer=use_stemmer)
    aggregator = scoring.BootstrapAggregator()
    for target, prediction in zip(targets, predictions):
        aggregator.add_scores(scorer.score(target=_split_sentences(target),
                                           prediction=_split_sentences(prediction)))
    result = aggregator.aggregate()
    return {key: 100.0 * float(result[key].mid.fmeasure) for key in score_keys}


# ----------------------------------------------------------------------------- combining

def _metric_name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or repr(fn)


# ----------------------------------------------------------------------------- tagging

def _chunk_ends(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    if prev_tag in ("E", "S") or (prev_tag in ("B", "I") and tag in ("B", "S", "O")):
        return True
    return prev_tag not in ("O", ".") and prev_type != type_


def _chunk_starts(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    if tag in ("B", "S") or (prev_tag in ("E", "S", "O") and tag in ("E", "I")):
        return True
    return tag not in ("O", ".") and prev_type != type_


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The (type, first, last) chunks of one tag sequence (BIO / IOB2, also IOBES), with conlleval's
    rules as seqeval's default mode applies them: an I- after O or after another type starts a
    chunk, a type change ends one."""
    chunks, prev_tag, prev_type, begin = [], "O", "", 0
    for i, chunk in enumerate([*tags, "O"]):
        tag, type_ = chunk[0], chunk[1:].split("-", maxsplit=1)[-1] or "_"
        if _chunk_ends(prev_tag, tag, prev_type, type_):
            chunks.append((prev_type, begin, i - 1))
        if _chunk_starts(prev_tag, tag, prev_type, type_):
            begin = i
        prev_tag, prev_type = tag, type_
    return chunks


def _prf(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return 100 * precision, 100 * recall, 100 * f1


def entity_f1(targets: Sequence[Sequence[str]], predictions: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity precision / recall / F1 (x100) over sentences of tags: micro over all types
    (`entity_*`) and per type (`<TYPE>_*`), an entity counting when type and span both match.
    A type with no gold or no predicted entity scores 0 there (seqeval's zero_division=0)."""
    targets, predictions = _as_lists("entity_f1", targets, predictions)
    gold, pred = collections.Counter(), collections.Counter()
    correct = collections.Counter()
    for i, (t, p) in enumerate(zip(targets, predictions)):
        if len(t) != len(p):
            raise ValueError(f"entity_f1: sentence {i} has {len(t)} gold tags but {len(p)} predicted")
        t_chunks, p_chunks = set(entities(t)), set(entities(p))
        gold.update(c[0] for c in t_chunks)
        pred.update(c[0] for c in p_chunks)
        correct.update(c[0] for c in t_chunks & p_chunks)
    out = dict(zip(("entity_precision", "entity_recall", "entity_f1"),
                   _prf(sum(correct.values()), sum(pred.values()), sum(gold.values()))))
    for type_ in sorted(set(gold) | set(pred)):
        out.update(zip((f"{type_}_precision", f"{type_}_recall", f"{type_}_f1"),
                       _prf(correct[type_], pred[type_], gold[type_])))
    return out


def token_accuracy(targets: Sequence[Sequence[str]], predictions: Sequence[Sequence[str]]) -> dict[str, float]:
    """Percentage of words (over all sentences) whose predicted tag is the gold one."""
    targets, predictions = _as_lists("token_accuracy", targets, predictions)
    pairs = [(a, b) for t, p in zip(targets, predictions) for a, b in zip(t, p, strict=True)]
    return {"token_accuracy": 100.0 * float(np.mean([a == b for a, b in pairs])) if pairs else 0.0}


def compute_metrics(metric_fns: Sequence[MetricFn], targets, predictions) -> dict[str, float]:
    """Runs each metric and merges the results into one dict.

    Two metrics reporting the same key would silently overwrite each other in the logs, so
    that is an error naming both.
    """
    targets, predictions = list(targets), list(predictions)
    names = [_metric_name(fn) for fn in metric_fns]
    if len(targets) != len(predictions):
        raise ValueError(f"compute_metrics ({', '.join(names)}): got {len(targets)} targets "
                         f"but {len(predictions)} predictions")
    merged: dict[str, float] = {}
    owner: dict[str, str] = {}
    for fn, name in zip(metric_fns, names):
        for key, value in fn(targets, predictions).items():
            if key in merged:
                raise ValueError(f"compute_metrics: key {key!r} returned by both "
                                 f"{owner[key]} and {name}")
            merged[key], owner[key] = value, name
    return merged
