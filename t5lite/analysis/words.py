"""Sentences as words (with UD's tags and trees when the file has them) and their subword inputs:
each word encoded on its own, as BERT and Hugging Face's `run_ner` split words, so every word owns
a span of subwords ([CLS] first and [SEP] last for encoders, EOS last for T5-style encoders).
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Sequence

import numpy as np

from t5lite.data import bio, vocab as vocab_lib
from t5lite.data.corruption.masking import special_ids
from t5lite.data.sources import Conll, Malformed
from t5lite.errors import DataError, DataNotFoundError

SENTENCE_ENDS = frozenset({".", "!", "?"})
# What to do about a missing file, by the flag that gave it.
MISSING_FILE_FIXES = {
    "--data_dir": "point --data_dir at the folder holding en_ewt/ and uner_en_ewt/ (Universal Dependencies "
                  "English-EWT and its Universal NER layer)",
    "--corpus": "give --corpus a CoNLL-U file or a text file"}


@dataclasses.dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    tags: tuple[str, ...] = ()          # UPOS (CoNLL-U) or BIO entity tags (IOB2)
    heads: tuple[int, ...] = ()         # CoNLL-U: each word's head, 1-based, 0 for the root
    relations: tuple[str, ...] = ()     # CoNLL-U: each word's dependency relation
    xpos: tuple[str, ...] = ()          # CoNLL-U: each word's language-specific tag (EWT: Penn Treebank's)


def _column(path: str, column: int) -> list[tuple[int, list[str], list[str]]]:
    """(line the sentence starts on, words, column `column`) of each sentence of a CoNLL file."""
    rows = []
    for where, row in Conll(tag_column=column)(path):
        if isinstance(row, Malformed):
            raise DataError(f"{path}: {row.reason} (near line {where}); fix the file")
        rows.append((where, row["words"], row["tags"]))
    return rows


def _heads(path: str, line: int, words: Sequence[str], heads: Sequence[str]) -> tuple[int, ...]:
    """A sentence's HEAD column, refused unless each is 0 (the root) or the number of one of its words."""
    for i, head in enumerate(heads, 1):
        if not head.isdigit() or int(head) > len(words):
            raise DataError(f"{path}: sentence at line {line}: word {i} ({words[i - 1]!r}) has HEAD {head!r}, but "
                            f"the sentence has {len(words)} words (0 is the root); fix the file")
    return tuple(map(int, heads))


def read_conll(path: str, limit: int | None = None, flag: str = "--data_dir") -> list[Sentence]:
    """The first `limit` sentences of a CoNLL-U file (UPOS, heads, relations, XPOS) or of an IOB2 file
    (Universal NER: word in column 2, tag in column 3, checked against IOB2: t5lite.data.bio). `flag`
    is the option that gave the file (a file under --data_dir, or --corpus), for the messages."""
    _require_file(path, flag)
    if not path.endswith(".conllu"):
        sentences = _column(path, 2)[:limit]
        for line, _, tags in sentences:
            bio.warn_once(path, line, tags)
        return _some_sentence([Sentence(tuple(w), tuple(t)) for _, w, t in sentences], path, flag)
    upos, heads, relations, xpos = (_column(path, c)[:limit] for c in (3, 6, 7, 4))
    return _some_sentence([Sentence(tuple(w), tuple(t), _heads(path, line, w, hs), tuple(r), tuple(x))
                           for (line, w, t), (_, _, hs), (_, _, r), (_, _, x) in zip(upos, heads, relations, xpos)],
                          path, flag)


def _require_file(path: str, flag: str) -> None:
    """Refuses a missing file, naming the flag that gave it and what to give instead."""
    if not os.path.isfile(path):
        raise DataNotFoundError(f"{flag}: {path} does not exist; {MISSING_FILE_FIXES[flag]}")


def _some_sentence(sentences: list[Sentence], path: str, flag: str) -> list[Sentence]:
    """`sentences`, refused if there is none: the analyses would have nothing to read."""
    if not sentences:
        raise DataError(f"{flag}: {path} has no sentence; give a file with at least one")
    return sentences


def _split_punctuation(word: str) -> list[str]:
    """A whitespace-separated word with the punctuation at its edges split off ("(sea)." -> "(", "sea",
    ")."), as the models' tokenizers split it, so that the word is found and read at its own first
    subword; a word of punctuation only ("@-@") stays whole."""
    return [part for part in re.fullmatch(r"(\W*)(.*?)(\W*)", word).groups() if part]


def _ends_sentence(word: str) -> bool:
    """Punctuation ending in ".", "!" or "?" ("." or ")." but not "3." or "@-@")."""
    return word[-1] in SENTENCE_ENDS and not re.search(r"\w", word)


def read_text(path: str, limit: int | None = None, max_words: int = 64) -> list[Sentence]:
    """Plain text: each line's whitespace-separated words with their edges' punctuation split off
    (`_split_punctuation`; WikiText's layout has it split already), cut into sentences after ".", "!"
    and "?", and into pieces of at most `max_words` words; the file is the one --corpus gave."""
    _require_file(path, "--corpus")
    sentences = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            current = []
            for word in (part for spaced in line.split() for part in _split_punctuation(spaced)):
                current.append(word)
                if _ends_sentence(word) or len(current) == max_words:
                    sentences.append(Sentence(tuple(current)))
                    current = []
            if current:
                sentences.append(Sentence(tuple(current)))
            if limit is not None and len(sentences) >= limit:
                return sentences[:limit]
    return _some_sentence(sentences, path, "--corpus")


@dataclasses.dataclass(frozen=True)
class Encoded:
    tokens: np.ndarray                  # [n] int32 model inputs
    starts: np.ndarray                  # [words] first subword of each word
    stops: np.ndarray                   # [words] one past its last subword
    special: np.ndarray                 # [n] bool: a token no word owns ([CLS], [SEP], EOS)


def one_position_per_word(n: int) -> Encoded:
    """Where the words of a model that reads whole words (ELMo, static vectors) sit: word i at position i."""
    positions = np.arange(n, dtype=np.int32)
    return Encoded(positions, positions, positions + 1, np.zeros(n, bool))


def encode(vocabulary, words: Sequence[str], arch: str) -> Encoded:
    """`words` as model inputs: [CLS] w1 .. wn [SEP] (encoders), w1 .. wn EOS (encoder-decoders'
    encoders), w1 .. wn (decoders). A word with no subword of its own gets the UNK id, so every
    word has a representation. Byte-level BPE words get their leading space except the first
    (`vocab.word_pieces(space_first=False)`): the model reads the sentence as the running text it was
    pre-trained on, `" ".join(words)` tokenized as it stands, where a text's first word has no space;
    tagging inputs follow `run_ner` instead and space every word, as the fine-tuned model saw them."""
    pieces = [p or [vocabulary.unk_id] for p in vocab_lib.word_pieces(vocabulary, words, space_first=False)]
    ids = special_ids(vocabulary) if arch == "encoder" else None
    prefix = [ids["cls"]] if ids else []
    suffix = [ids["sep"]] if ids else [vocabulary.eos_id] if arch == "encoder_decoder" else []
    lengths = np.array([len(p) for p in pieces])
    starts = len(prefix) + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    tokens = np.asarray(prefix + [t for p in pieces for t in p] + suffix, np.int32)
    special = np.zeros(len(tokens), bool)
    special[:len(prefix)] = True
    special[len(tokens) - len(suffix):] = True
    return Encoded(tokens, starts, starts + lengths, special)
