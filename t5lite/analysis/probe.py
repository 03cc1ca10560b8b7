"""`t5lite probe`: what each layer of a frozen model holds, read by probes trained on its word
vectors (each word's first subword; layer 0 is the embedding layer's output). Linear probes tag
UPOS (UD English-EWT train -> test) and named entities (Universal NER: dev -> test); the span
probe (`ner_spans`) types each gold entity span (PER / LOC / ORG) from its pooled subwords
(t5lite.analysis.spans); the structural probe (t5lite.analysis.structural) recovers dependency
trees (UD train -> test, stopped early on UD dev). Every probe is trained again on the same shape of model freshly
initialised: the control, which says how much a probe reads from the architecture and the word
identities alone.
"""
from __future__ import annotations

import logging
import os
from typing import Sequence

import numpy as np

from t5lite import finite
from t5lite.analysis import forward, linear, loading, spans, structural, words
from t5lite.data.tasks.tagging import UNER_TAGS, UPOS_TAGS
from t5lite.errors import ConfigError
from t5lite.plotting import plain_ticks, pyplot

log = logging.getLogger("t5lite")

PROBES = ("pos", "ner", "ner_spans", "structural")
UD = "en_ewt/en_ewt-ud-{}.conllu"
UNER = "uner_en_ewt/en_ewt-ud-{}.iob2"
# The split each probe trains on, the one it reports, and the structural probe's early-stopping
# split (UNER's train split has no entity layer).
SPLITS = {"pos": (UD, "train", "test"), "structural": (UD, "train", "test", "dev"), "ner": (UNER, "dev", "test"),
          "ner_spans": (UNER, "dev", "test")}
PARTS = ("train", "test", "dev")
ENTITY_TYPES = tuple(dict.fromkeys(t[2:] for t in UNER_TAGS if t != "O"))   # PER, LOC, ORG


def features(subject: loading.Subject, sentences: Sequence[words.Sentence], span_pooling: str | None = None):
    """Per sentence [layers + 1, words, d_model]: each word's first subword in every layer; with
    `span_pooling`, per sentence [layers + 1, entity spans, d] (t5lite.analysis.spans) instead."""
    states, encoded = forward.word_states(subject, sentences)
    if span_pooling is None:
        return [h[:, e.starts] for h, e in zip(states, encoded)]
    return [spans.span_vectors(h, e, spans.entity_spans(s), span_pooling)
            for h, e, s in zip(states, encoded, sentences)]


def _per_layer(x_train, y_train, x_test, classes: int, l2: float):
    """Each layer's test predictions of a softmax-regression probe trained on that layer."""
    for layer in range(x_train[0].shape[0]):
        train = np.concatenate([v[layer] for v in x_train])
        test = np.concatenate([v[layer] for v in x_test])
        yield linear.predict_proba(linear.fit(train, y_train, classes, l2=l2), test).argmax(-1)


def _tag_ids(sentences, names) -> np.ndarray:
    index = {name: i for i, name in enumerate(names)}
    return np.array([index[t] for s in sentences for t in s.tags], np.int32)


def tagging(train, test, train_vecs, test_vecs, names, l2: float) -> dict:
    """Accuracy per layer of a softmax-regression probe (and, for BIO tags, on entity words alone)."""
    y_train, y_test = _tag_ids(train, names), _tag_ids(test, names)
    entity = y_test != names.index("O") if "O" in names else None
    result = {"accuracy": []} | ({"entity_word_accuracy": []} if entity is not None else {})
    for guess in _per_layer(train_vecs, y_train, test_vecs, len(names), l2):
        result["accuracy"].append(float(np.mean(guess == y_test)))
        if entity is not None:
            result["entity_word_accuracy"].append(float(np.mean(guess[entity] == y_test[entity])))
    return result


def span_typing(train, test, train_vecs, test_vecs, l2: float) -> dict:
    """Accuracy per layer of a softmax-regression probe typing gold entity spans (ENTITY_TYPES)."""
    y_train, y_test = (spans.span_labels(part, ENTITY_TYPES) for part in (train, test))
    if not len(y_train) or not len(y_test):
        raise ConfigError(f"the span probe read {len(y_train)} training and {len(y_test)} test entities; "
                          "give more --train_sentences / --test_sentences")
    return {"accuracy": [float(np.mean(guess == y_test))
                         for guess in _per_layer(train_vecs, y_train, test_vecs, len(ENTITY_TYPES), l2)]}


def distances(train, test, dev, train_vecs, test_vecs, dev_vecs, rank: int, epochs: int, seed: int) -> dict:
    """UUAS, distance Spearman, test loss and epochs trained per layer of the structural probe."""
    if not dev:
        raise ConfigError("the structural probe read no UD dev sentences to stop on; give more --test_sentences")
    gold_train, gold_test, gold_dev = ([structural.tree_distances(s.heads) for s in part]
                                       for part in (train, test, dev))
    punct = [structural.punctuation(s.xpos) for s in test]
    result = {"uuas": [], "spearman": [], "loss": [], "epochs": []}
    for layer in range(train_vecs[0].shape[0]):
        b, trained = structural.fit([v[layer] for v in train_vecs], gold_train, [v[layer] for v in dev_vecs], gold_dev,
                                    rank=rank, max_epochs=epochs, seed=seed)
        test_layer = [v[layer] for v in test_vecs]
        predicted = structural.predict(b, test_layer)
        result["uuas"].append(structural.uuas(predicted, gold_test, punct))
        result["spearman"].append(structural.distance_spearman(predicted, gold_test))
        h, gold, lengths = structural.padded(test_layer, gold_test)
        result["loss"].append(float(structural.loss(b, h, gold, lengths)))
        result["epochs"].append(trained)
    return result


def run(subject: loading.Subject, data_dir: str, probes: Sequence[str] = ("pos", "structural"),
        train_sentences: int = 500, test_sentences: int = 200, rank: int = 32, epochs: int = 40,
        l2: float = 1e-3, control: bool = True, seed: int = 0, span_pooling: str = "mean") -> dict:
    """{probe: {model name: {score: [per layer]}}} for the model and (with `control`) its untrained
    twin, and under "sentences_read" each probe's sentences that fit the model (the span probe:
    also its entity spans). The structural probe stops early on the first `test_sentences` of UD dev,
    `epochs` at most."""
    unknown = sorted(set(probes) - set(PROBES))
    if unknown or not probes:
        raise ConfigError(f"--probes {','.join(probes)}: choose from {','.join(PROBES)}")
    if span_pooling not in spans.POOLINGS:
        raise ConfigError(f"--span_pooling {span_pooling}: choose from {', '.join(spans.POOLINGS)}")
    subjects = [subject] + ([loading.untrained(subject, seed)] if control else [])
    results = {"model": subject.name, "layers": "0 = embeddings, k = the output of layer k", "settings": dict(
        train_sentences=train_sentences, test_sentences=test_sentences, rank=rank, epochs=epochs, l2=l2, seed=seed,
        span_pooling=span_pooling)}
    cache = {}
    for name in probes:
        pattern, *splits = SPLITS[name]
        data = [forward.read_fitting(subject, os.path.join(data_dir, pattern.format(split)), limit)
                for split, limit in zip(splits, (train_sentences, test_sentences, test_sentences))]
        results[name] = {}
        read = results.setdefault("sentences_read", {})[name] = dict(zip(PARTS, map(len, data)))
        pooling = span_pooling if name == "ner_spans" else None
        if pooling:
            read |= {f"{part}_spans": sum(len(spans.entity_spans(x)) for x in sentences)
                     for part, sentences in zip(("train", "test"), data)}
        for s in subjects:
            vecs = []
            for split, part in zip(splits, data):
                key = (s.name, pattern, split, pooling)
                if key not in cache:
                    cache[key] = features(s, part, pooling)
                vecs.append(cache[key])
            log.info("%s probe of %s on %s sentences", name, s.name, " + ".join(map(str, map(len, data))))
            if name == "structural":
                results[name][s.name] = distances(*data, *vecs, rank, epochs, seed)
            elif pooling:
                results[name][s.name] = span_typing(*data, *vecs, l2)
            else:
                results[name][s.name] = tagging(*data, *vecs, UPOS_TAGS if name == "pos" else UNER_TAGS, l2)
    return results


def write(results: dict, out: str) -> list[str]:
    """probe.json and probe.png (`figure`) under `out`."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "probe.json"), "w") as f:
        finite.dump(finite.null_non_finite(results), f, indent=1)   # undefined: null
    fig = figure(results)
    fig.savefig(os.path.join(out, "probe.png"), dpi=110)
    pyplot().close(fig)
    return [os.path.join(out, "probe.json"), os.path.join(out, "probe.png")]


def figure(results: dict):
    """Each probe's scores per layer, model against control, one panel per score."""
    panels = [(p, score) for p in PROBES if p in results for score in next(iter(results[p].values()))
              if score not in ("loss", "epochs")]
    fig, axes = pyplot().subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for ax, (p, score) in zip(axes[0], panels):
        for model, scores in results[p].items():
            ax.plot(range(len(scores[score])), scores[score], marker="o", label=model,
                    linestyle="--" if model.endswith("(untrained)") else "-")
        label = f"{p} ({results['settings']['span_pooling']})" if p == "ner_spans" else p
        ax.set(title=f"{label}: {score}", xlabel="layer (0 = embeddings)")
        plain_ticks(ax, integer_x=True)   # layers are whole numbers
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(results["model"])
    fig.tight_layout()
    return fig
