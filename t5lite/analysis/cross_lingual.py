"""Cross-lingual word retrieval of a BERT trained on English and Fake-English
(t5lite.data.fake_english), as Dufter & Schütze's word translation (pdufter/minimult, evaluate.py):
every vocabulary piece read alone as `[CLS] piece [SEP]`, in English and as its Fake twin, each
layer's vector of the piece, and the share of English pieces whose nearest Fake vector by cosine is
their own twin (precision@1, `t5lite.analysis.align.precision_at_k`), and the other way round.
A model that keeps the two languages apart scores near 1 / (number of pieces). `plot` draws
several runs' results side by side (with and without the shared anchors, say).
"""
from __future__ import annotations

import json

import numpy as np

from t5lite import plotting
from t5lite.analysis import align, forward, loading, neighbours
from t5lite.data import fake_english
from t5lite.data.corruption.masking import random_pool, special_ids
from t5lite.data.word_vectors import WordVectors
from t5lite.errors import ConfigError


def pieces(subject: loading.Subject, corpus: str | None = None) -> np.ndarray:
    """The English ids to retrieve: every piece that is no special token or sentinel, or with
    `corpus` (a text file) only those its text holds."""
    ids = random_pool(subject.vocabulary)
    if corpus is None:
        return ids
    with open(corpus, encoding="utf-8") as f:
        seen = np.unique(np.asarray(subject.vocabulary.encode(f.read()), np.int64))
    return np.intersect1d(ids, seen)


def inputs(subject: loading.Subject, ids: np.ndarray, share_special: bool = True,
           share_positions: bool = True) -> dict[str, np.ndarray]:
    """`[CLS] id [SEP]` rows, English then Fake (ids shifted as the training data shifts them), with
    each row's positions and token types: the Fake rows' positions start at the second half of
    the model's position table when `share_positions` is off, as `fake_english` gives them."""
    vocabulary = subject.vocabulary
    shift = int(vocabulary.vocab_size)
    specials = special_ids(vocabulary)
    english = np.stack([np.full(len(ids), specials["cls"]), ids, np.full(len(ids), specials["sep"])], 1)
    shared = fake_english.anchors(vocabulary) if share_special else np.array([vocabulary.pad_id])
    fake = fake_english.shift_ids(english, shift, shared)
    if int(fake.max()) >= subject.module.config.vocab_size:
        raise ConfigError(f"--model {subject.name}: its embedding has {subject.module.config.vocab_size} rows, "
                          f"fewer than English and Fake-English need ({2 * shift}); give a run trained on a "
                          "*_fake_english_mlm task")
    offset = 0 if share_positions else subject.module.config.max_position_embeddings // 2
    positions = np.broadcast_to(np.arange(3), english.shape)
    token_types = np.zeros_like(english)
    return {"tokens": np.concatenate([english, fake]).astype(np.int32),
            "positions": np.concatenate([positions, positions + offset]).astype(np.int32),
            "token_types": np.concatenate([token_types, token_types + (not share_positions)]).astype(np.int32)}


def retrieval(subject: loading.Subject, ids: np.ndarray, share_special: bool = True, share_positions: bool = True,
              batch_size: int = 256) -> dict:
    """Per layer (0: the embeddings), precision@1 from English to Fake and from Fake to English."""
    rows = inputs(subject, ids, share_special, share_positions)
    states = np.concatenate([forward.encoder_states(subject, *(rows[k][i:i + batch_size] for k in
                                                                ("tokens", "positions", "token_types")))[:, :, 1]
                             for i in range(0, len(rows["tokens"]), batch_size)], axis=1)
    names = tuple(str(i) for i in ids)
    pairs = [(name, name) for name in names]
    identity = np.eye(states.shape[-1])
    layers = []
    for layer in states:
        english, fake = WordVectors(names, layer[:len(ids)]), WordVectors(names, layer[len(ids):])
        forward_p1 = align.precision_at_k(english, fake, identity, pairs, ks=(1,), method="nn")["precision_at_1"]
        backward_p1 = align.precision_at_k(fake, english, identity, pairs, ks=(1,), method="nn")["precision_at_1"]
        layers.append({"english_to_fake": forward_p1, "fake_to_english": backward_p1})
    return {"model": subject.name, "pieces": len(ids), "share_special": share_special,
            "share_positions": share_positions, "chance": 1 / len(ids), "layers": layers}


def write(result: dict, out: str) -> str:
    return neighbours.write(result, out, "cross_lingual.json")


def label(result: dict) -> str:
    """A run's name and which anchors its two languages shared."""
    shared = [name for name, on in (("special tokens", result["share_special"]),
                                    ("positions", result["share_positions"])) if on]
    return f"{result['model']} (shared: {', '.join(shared) or 'nothing'})"


def plot(result_paths: list[str], out: str) -> str:
    """English to Fake precision@1 per layer of each `cross_lingual.json`, one line per run, and chance."""
    results = [read_result(path) for path in result_paths]
    return plot_layers([(label(r), [layer["english_to_fake"] for layer in r["layers"]]) for r in results],
                       results[-1]["chance"], "precision@1, English to Fake", out)


def read_result(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def plot_layers(curves: list[tuple[str, list[float]]], chance: float, ylabel: str, out: str) -> str:
    """One line of scores per layer for each (label, scores), and chance: the retrieval plots' figure."""
    plt = plotting.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, scores in curves:
        ax.plot(range(len(scores)), scores, marker="o", label=name)
    ax.axhline(chance, color="grey", linestyle=":", label="chance")
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    plotting.plain_ticks(ax, integer_x=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
