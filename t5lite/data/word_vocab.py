"""Word vocabularies for the recurrent language models (ELMo's biLM, ULMFiT's AWD-LSTM): the
most frequent whitespace tokens of a training text plus bilm's specials.

The file format is bilm-tf's `vocab.txt`: one token per line, `</S>`, `<S>` and `<UNK>` first,
then the words by falling frequency. Id 0 is padding (not in the file), so line i has id i + 1:
`</S>` 1 (EOS), `<S>` 2, `<UNK>` 3, as t5lite's converters pad with 0 and drop it from the loss.

    vocab = word_vocabulary(task="wikitext2", size=8192, data_dir="/data")   # built once, cached
"""
from __future__ import annotations

import collections
import functools
import hashlib
import logging
import os
from typing import Iterable, Sequence

import gin
from etils import epath

from t5lite.data.cache import default_cache_dir
from t5lite.data.registry import TaskRegistry
from t5lite.errors import ConfigError, DataError, DataNotFoundError

log = logging.getLogger("t5lite")

SPECIALS = ("</S>", "<S>", "<UNK>")
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3


class WordVocabulary:
    """Whitespace tokens <-> ids (the shared vocabulary interface: encode, decode, vocab_size,
    pad_id, eos_id, unk_id, id_to_piece)."""
    pad_id, eos_id, bos_id, unk_id = PAD_ID, EOS_ID, BOS_ID, UNK_ID

    def __init__(self, words: Sequence[str], lowercase: bool = False):
        if tuple(words[:3]) != SPECIALS:
            raise DataError(f"a word vocabulary starts with {' '.join(SPECIALS)} (bilm's vocab.txt); got "
                            f"{' '.join(words[:3])}")
        self.words, self.lowercase = list(words), lowercase
        self._ids = {w: i + 1 for i, w in enumerate(self.words)}

    @property
    def vocab_size(self) -> int:
        return len(self.words) + 1

    def __repr__(self):
        return f"WordVocabulary({self.vocab_size} ids, lowercase={self.lowercase})"

    def tokens(self, text: str) -> list[str]:
        return (text.lower() if self.lowercase else text).split()

    def encode_tokens(self, tokens: Iterable[str]) -> list[int]:
        return [self._ids.get(t, UNK_ID) for t in tokens]

    def encode(self, text: str) -> list[int]:
        return self.encode_tokens(self.tokens(text))

    def id_to_piece(self, i: int) -> str:
        return "<pad>" if i == PAD_ID else self.words[i - 1]

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(self.id_to_piece(int(i)) for i in ids if int(i) != PAD_ID)

    def save(self, path: str) -> None:
        epath.Path(path).write_text("\n".join(self.words) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str, lowercase: bool = False) -> "WordVocabulary":
        if not epath.Path(path).exists():
            raise DataNotFoundError(f"word vocabulary {path!r} does not exist; give a bilm vocab.txt or leave "
                                    "word_vocabulary.path unset to build one from word_vocabulary.task")
        return cls(epath.Path(path).read_text(encoding="utf-8").split("\n")[:-1], lowercase)


def build(texts: Iterable[str], size: int | None = None, lowercase: bool = False) -> WordVocabulary:
    """The `size` - 4 most frequent tokens (ties by first appearance) after the specials and the
    pad, so the vocabulary has at most `size` ids; None keeps every token."""
    counts = collections.Counter(t for text in texts for t in (text.lower() if lowercase else text).split())
    for special in SPECIALS:
        counts.pop(special, None)
    keep = None if size is None else size - len(SPECIALS) - 1
    if keep is not None and keep < 1:
        raise ConfigError(f"word_vocabulary.size={size}: needs room for the pad, {', '.join(SPECIALS)} and a word")
    return WordVocabulary(list(SPECIALS) + [w for w, _ in counts.most_common(keep)], lowercase)


@gin.configurable
@functools.lru_cache(maxsize=8)
def word_vocabulary(path: str | None = None, task: str | None = None, split: str = "train", field: str = "text",
                    size: int | None = None, lowercase: bool = False, data_dir: str | None = None) -> WordVocabulary:
    """The word vocabulary of the `word_lm*` / `word_classification*` converters and the recurrent
    objectives: a bilm `vocab.txt` at `path`, or built from the `field` of `task`'s raw `split`
    records (cached under the t5lite cache folder, so every run on the same text gets the same ids)."""
    if path is not None:
        return WordVocabulary.load(path, lowercase)
    if task is None:
        raise ConfigError("word_vocabulary needs a path (a bilm vocab.txt) or a task to build it from; set "
                          "word_vocabulary.task (e.g. 'wikitext2') and word_vocabulary.data_dir")
    records = TaskRegistry.get(task).source.load(split, data_dir=data_dir)
    texts = [r[field] for r in records]
    digest = hashlib.sha256("\0".join([str(size), str(lowercase), *texts]).encode("utf-8")).hexdigest()[:16]
    cached = os.path.join(default_cache_dir(), "word_vocab", f"{task}_{split}_{digest}.txt")
    if epath.Path(cached).exists():
        return WordVocabulary.load(cached, lowercase)
    vocabulary = build(texts, size, lowercase)
    epath.Path(cached).parent.mkdir(parents=True, exist_ok=True)
    vocabulary.save(cached)
    log.info("built the word vocabulary of %s/%s (%d ids): %s", task, split, vocabulary.vocab_size, cached)
    return vocabulary
