"""`t5lite attention`: what each self-attention head attends to, after Clark et al. (2019), "What
does BERT look at?". Per layer and head, averaged over every query token: the attention mass on
[CLS], on [SEP] (or EOS), on the next and the previous token, on punctuation (the subwords of UD's
PUNCT words), and the entropy of the head's distribution. Per dependency relation (UD's universal
relation, subtypes folded in), the head and direction whose word-level attention most often points
at the dependent's head (Clark et al.'s `attn_head_predictor`, Syntax_Analysis.ipynb in
clarkkev/attention-analysis: self-attention zeroed, each word's most-attended other word is its
guessed head, read both from the dependent and, transposed, from the head), against their best
fixed-offset baseline (offsets -3 to 2); word-level attention sums the attended word's subwords and
averages over the attending word's. And heatmaps of one sentence's heads. Heads are named
"layer-head", both counted from 1, as in Clark et al.'s paper (their code prints them from 0).
"""
from __future__ import annotations

import collections
import os
from typing import Sequence

import numpy as np

from t5lite import finite
from t5lite.analysis import forward, loading, words
from t5lite.errors import ConfigError
from t5lite.plotting import pyplot

STATISTICS = ("cls", "sep", "next", "previous", "punctuation", "entropy")


def token_roles(encoded: words.Encoded, sentence: words.Sentence) -> dict[str, np.ndarray]:
    """Boolean [tokens] masks of the tokens each statistic sums attention over."""
    n = len(encoded.tokens)
    prefix = np.arange(n) < encoded.starts[0]
    punct = np.zeros(n, bool)
    for start, stop, tag in zip(encoded.starts, encoded.stops, sentence.tags):
        punct[start:stop] = tag == "PUNCT"
    return {"cls": encoded.special & prefix, "sep": encoded.special & ~prefix, "punctuation": punct}


def head_statistics(weights: np.ndarray, roles: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Sums over the query tokens of one sentence's weights [layers, heads, q, k]: {statistic: [L, H]}."""
    n = weights.shape[-1]
    sums = {name: weights[..., mask].sum((-1, -2)) for name, mask in roles.items()}
    sums["next"] = np.einsum("lhii->lh", weights[..., :-1, 1:]) if n > 1 else np.zeros(weights.shape[:2])
    sums["previous"] = np.einsum("lhii->lh", weights[..., 1:, :-1]) if n > 1 else np.zeros(weights.shape[:2])
    sums["entropy"] = -np.sum(weights * np.log(np.where(weights > 0, weights, 1.0)), (-1, -2))
    return sums


def word_attention(weights: np.ndarray, encoded: words.Encoded) -> np.ndarray:
    """[..., q, k] token attention -> [..., words, words]: summed over the attended word's
    subwords, averaged over the attending word's."""
    to_words = np.stack([weights[..., a:b].sum(-1) for a, b in zip(encoded.starts, encoded.stops)], -1)
    return np.stack([to_words[..., a:b, :].mean(-2) for a, b in zip(encoded.starts, encoded.stops)], -2)


def head_name(layer: int, head: int) -> str:
    """The name of the head at 0-based array indices (layer, head): "layer-head", both from 1."""
    return f"{layer + 1}-{head + 1}"


def relation(name: str) -> str:
    return name.split(":")[0]


# Clark et al.'s two directions: row i of the attention (what word i attends to) and column i
# (which word attends most to word i); their names.
DIRECTIONS = ("dep->head", "head<-dep")
OFFSETS = range(-3, 3)      # their baseline's offsets: `range(-3, 3)` in Syntax_Analysis.ipynb


def head_guesses(word_weights: np.ndarray) -> np.ndarray:
    """[L, H, 2, words]: each word's most-attended other word (0-based) per head, in each of
    DIRECTIONS, self-attention zeroed first (Clark et al.'s `attn_head_predictor`)."""
    both = np.stack([word_weights, np.swapaxes(word_weights, -1, -2)], 2)
    n = both.shape[-1]
    both[..., np.arange(n), np.arange(n)] = 0
    return both.argmax(-1)


def _last_argmax(x: np.ndarray) -> int:
    """The last flat index of x's maximum: Clark et al. take `sorted(...)[-1]`, so ties go to the
    highest (layer, head, direction) or offset."""
    flat = x.ravel()
    return flat.size - 1 - int(np.argmax(flat[::-1]))


def dependency_accuracy(word_weights: Sequence[np.ndarray], sentences: Sequence[words.Sentence]) -> dict:
    """Per relation (the root left out): how often each head, in each direction, guesses a dependent's
    head word; the best head (`head_name`) and direction, its accuracy, the count, and the best
    offset of OFFSETS (a guess clipped to the sentence, as their `offset_predictor`)."""
    correct, count, offsets = {}, collections.Counter(), collections.defaultdict(lambda: np.zeros(len(OFFSETS)))
    for w, s in zip(word_weights, sentences):
        guesses = head_guesses(w)                                # [L, H, 2, words]
        for i, (head, rel) in enumerate(zip(s.heads, s.relations)):
            if head == 0:
                continue
            rel = relation(rel)
            correct[rel] = correct.get(rel, 0) + (guesses[..., i] == head - 1)
            count[rel] += 1
            offsets[rel] += [max(0, min(i + o + 1, len(s.words))) == head for o in OFFSETS]
    result = {}
    for rel in sorted(count, key=count.get, reverse=True):
        acc = correct[rel] / count[rel]
        layer, head, direction = np.unravel_index(_last_argmax(acc), acc.shape)
        best = _last_argmax(offsets[rel])
        result[rel] = {"count": count[rel], "head": head_name(layer, head),
                       "direction": DIRECTIONS[direction], "accuracy": float(acc[layer, head, direction]),
                       "baseline_offset": OFFSETS[best], "baseline_accuracy": float(offsets[rel][best] / count[rel])}
    return result


def analyse(subject: loading.Subject, sentences: Sequence[words.Sentence]) -> tuple[dict, list]:
    """(results, per-sentence attention [layers, heads, q, k]) for CoNLL-U `sentences` (those that
    fit the model's positions: see `forward.fitting`)."""
    arch = subject.module.config.arch
    encoded = [words.encode(subject.vocabulary, s.words, arch) for s in sentences]
    _, weights = forward.run(subject, encoded, attention=True)
    totals, queries = {}, 0
    for w, e, s in zip(weights, encoded, sentences):
        for name, value in head_statistics(w, token_roles(e, s)).items():
            totals[name] = totals.get(name, 0) + value
        queries += w.shape[-2]
    heads = {head_name(*index): {name: round(float(totals[name][index] / queries), 4) for name in STATISTICS}
             for index in np.ndindex(totals["cls"].shape)}
    results = {"model": subject.name, "sentences": len(sentences), "query_tokens": queries,
               "head_names": "layer-head, both counted from 1", "heads": heads,
               "relations": dependency_accuracy([word_attention(w, e) for w, e in zip(weights, encoded)],
                                                sentences)}
    return results, weights


def heatmaps(weights: np.ndarray, labels: Sequence[str], path: str, title: str) -> None:
    """heatmap_figure as a PNG at `path`."""
    fig = heatmap_figure(weights, labels, title)
    fig.savefig(path, dpi=100)
    pyplot().close(fig)


def heatmap_figure(weights: np.ndarray, labels: Sequence[str], title: str):
    """One panel per layer (rows) and head (columns) of a sentence's attention [L, H, q, k], each
    row a query token, and the colour bar of the attention weight."""
    plt = pyplot()
    layers, heads, n, _ = weights.shape
    fig, axes = plt.subplots(layers, heads, figsize=(1.3 * heads + 2, 1.6 * layers + 1), squeeze=False,
                             layout="constrained")
    for (l, h), ax in np.ndenumerate(axes):
        image = ax.imshow(weights[l, h], cmap="Blues", vmin=0, vmax=1)
        ax.set_xticks([])
        ax.set_yticks([])
        if l == 0:
            ax.set_title(f"head {h + 1}", fontsize=8)
        if h == 0:
            ax.set_ylabel(f"layer {l + 1}", fontsize=8)
    if n <= 40:   # the tokens along the first panel, where they fit
        axes[0][0].set_yticks(range(n), labels, fontsize=6)
    bar = fig.colorbar(image, ax=axes, shrink=min(1.0, 3 / layers + 0.2), aspect=30)
    bar.set_label("attention weight (row: query token, column: attended token)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=9)
    return fig


def write(subject: loading.Subject, results: dict, weights: Sequence[np.ndarray], sentences, out: str,
          example: int = 0) -> list[str]:
    """attention.json and attention_heads.png (sentence `example`'s heads) under `out`."""
    if not 0 <= example < len(sentences):
        raise ConfigError(f"--example {example}: choose one of the {len(sentences)} sentences (0 to {len(sentences) - 1})")
    os.makedirs(out, exist_ok=True)
    encoded = words.encode(subject.vocabulary, sentences[example].words, subject.module.config.arch)
    labels = [subject.vocabulary.decode([int(t)]) or subject.vocabulary.id_to_piece(int(t))   # [CLS] decodes to ''
              for t in encoded.tokens]
    results = results | {"heatmap_sentence": " ".join(sentences[example].words)}
    with open(os.path.join(out, "attention.json"), "w") as f:
        finite.dump(results, f, indent=1)
    png = os.path.join(out, "attention_heads.png")
    heatmaps(weights[example], labels, png, f"{subject.name}: {' '.join(sentences[example].words)[:100]}")
    return [os.path.join(out, "attention.json"), png]
