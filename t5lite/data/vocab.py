"""SentencePiece vocabularies with T5's sentinel ids, and training one on a corpus.

T5 convention: pad 0, EOS 1, UNK 2, and `extra_ids` sentinels at the top of the vocabulary,
`<extra_id_0>` = vocab_size - 1 counting down.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Iterable

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_pb2

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2


class SentencePieceVocabulary:
    """A SentencePiece model with `extra_ids` sentinels appended as user-defined pieces (as seqio does).

    Appending them to the model itself lets SentencePiece encode `<extra_id_N>` inside text and
    decode it back with the spacing around it intact. As in seqio the pieces are named
    `▁<extra_id_N>` (word-initial): `a <extra_id_0>ly` holds one sentinel id, while
    `jel<extra_id_0>ly` or `value<extra_id_0>` is plain text.
    """

    def __init__(self, model_path: str, extra_ids: int = 100):
        self.model_path = str(model_path)
        self.extra_ids = extra_ids
        with open(self.model_path, "rb") as f:
            proto = sp_pb2.ModelProto.FromString(f.read())
        self.base_vocab_size = len(proto.pieces)
        for i in reversed(range(extra_ids)):
            proto.pieces.add(piece=f"▁<extra_id_{i}>", score=0.0, type=sp_pb2.ModelProto.SentencePiece.USER_DEFINED)
        self._sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
        if self._sp.pad_id() != PAD_ID or self._sp.eos_id() != EOS_ID or self._sp.unk_id() != UNK_ID:
            raise ValueError(
                f"{self.model_path}: expected pad/eos/unk ids 0/1/2 as in T5, got "
                f"{self._sp.pad_id()}/{self._sp.eos_id()}/{self._sp.unk_id()}; train the model with "
                "pad_id=0 eos_id=1 unk_id=2 bos_id=-1 (see t5lite.data.vocab.train_sentencepiece)."
            )

    def __repr__(self):
        return f"SentencePieceVocabulary({self.model_path!r}, extra_ids={self.extra_ids})"

    @property
    def vocab_size(self) -> int:
        return self.base_vocab_size + self.extra_ids

    pad_id, eos_id, unk_id = PAD_ID, EOS_ID, UNK_ID

    def sentinel_id(self, i: int) -> int:
        if not 0 <= i < self.extra_ids:
            raise ValueError(f"sentinel {i} out of range: this vocabulary has {self.extra_ids} extra ids")
        return self.vocab_size - 1 - i

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids to text, stopping at the first EOS; ids past the vocabulary decode as UNK (as in seqio)."""
        ids = [int(i) for i in ids]
        if EOS_ID in ids:
            ids = ids[:ids.index(EOS_ID)]
        return self._sp.decode([UNK_ID if i >= self.vocab_size else i for i in ids if i != PAD_ID])

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))


def default_cache_dir() -> str:
    return os.environ.get("T5LITE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "t5lite"))


def train_sentencepiece(texts: Iterable[str], vocab_size: int, out_dir: str | None = None,
                        model_type: str = "unigram", seed_sentencepiece_size: int = 200_000,
                        byte_fallback: bool = False) -> str:
    """Trains a T5-style SentencePiece model (pad 0, EOS 1, UNK 2, no BOS) and caches it.

    `byte_fallback` spends 256 of the `vocab_size` pieces on UTF-8 bytes so that characters
    unseen in training (other scripts, emoji) round-trip instead of becoming UNK.
    The file name holds a hash of the corpus and the settings, so a second call with the same
    corpus returns the cached model instead of training again.
    """
    if byte_fallback and vocab_size < 256 + 4:
        raise ValueError(f"vocab_size={vocab_size} cannot hold the 256 byte pieces of byte_fallback; "
                         "use a vocab_size of at least 260 or byte_fallback=False")
    texts = [t for t in texts if t.strip()]
    digest = hashlib.sha256()
    for t in texts:
        digest.update(t.encode("utf-8"))
        digest.update(b"\0")
    digest.update(f"{vocab_size}-{model_type}-byte_fallback={byte_fallback}".encode())
    out_dir = out_dir or os.path.join(default_cache_dir(), "vocab")
    os.makedirs(out_dir, exist_ok=True)
    name = f"spm_{model_type}_{vocab_size}{'_bytes' if byte_fallback else ''}_{digest.hexdigest()[:12]}.model"
    path = os.path.join(out_dir, name)
    if os.path.exists(path):
        return path
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(t.replace("\n", " ") + "\n")
        prefix = os.path.join(tmp, "spm")
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=prefix, vocab_size=vocab_size, model_type=model_type,
            pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
            character_coverage=1.0, byte_fallback=byte_fallback, input_sentence_size=2_000_000, shuffle_input_sentence=True,
            seed_sentencepiece_size=seed_sentencepiece_size, max_sentence_length=1 << 16,
            num_threads=os.cpu_count() or 1, minloglevel=2,
        )
        # Write atomically so a concurrent reader never sees a half-written model.
        tmp_path = path + f".tmp{os.getpid()}"
        with open(prefix + ".model", "rb") as src, open(tmp_path, "wb") as dst:
            dst.write(src.read())
        os.replace(tmp_path, path)
    return path


def padded_vocab_size(vocab_size: int, multiple: int = 128) -> int:
    """Embedding rows rounded up for TPU-friendly shapes (T5: 32100 -> 32128)."""
    return int(np.ceil(vocab_size / multiple) * multiple)


class DefaultVocabulary:
    """The vocabulary the built-in tasks use, resolved on first use.

    By default a 2000-piece unigram model with byte fallback (so any script round-trips) trained
    on the embedded corpus (cached); point it at an existing SentencePiece file (e.g. T5's public `spiece.model`) with `set_default_vocabulary`.
    """
    _path: str | None = None
    _vocab: SentencePieceVocabulary | None = None
    base_size = 2000
    extra_ids = 100

    def _resolve(self) -> SentencePieceVocabulary:
        cls = DefaultVocabulary
        if cls._vocab is None:
            if cls._path is None:
                from t5lite.data.corpus import embedded_documents
                cls._path = train_sentencepiece(embedded_documents(), cls.base_size, byte_fallback=True)
            cls._vocab = open_vocabulary(cls._path, cls.extra_ids)
        return cls._vocab

    def __getattr__(self, name):
        return getattr(self._resolve(), name)

    def __repr__(self):
        return f"DefaultVocabulary(path={DefaultVocabulary._path or 'trained on the embedded corpus on first use'})"


def open_vocabulary(path: str, extra_ids: int = 100):
    """A SentencePiece model, or BERT's WordPiece for a `vocab.txt` / `tokenizer.json` (no extra ids)."""
    if path.endswith((".txt", ".json")):
        from t5lite.data.wordpiece import WordPieceVocabulary
        return WordPieceVocabulary(path)
    return SentencePieceVocabulary(path, extra_ids)


def set_default_vocabulary(path: str | None, extra_ids: int = 100) -> None:
    """Makes the built-in tasks use this SentencePiece model or WordPiece vocabulary (None: the
    embedded-corpus SentencePiece one)."""
    if path is not None and not os.path.exists(path):
        raise FileNotFoundError(f"vocabulary {path!r} does not exist; pass a SentencePiece .model file, or a BERT "
                                "vocab.txt / tokenizer.json")
    DefaultVocabulary._path, DefaultVocabulary._vocab = path, None
    DefaultVocabulary.extra_ids = extra_ids


DEFAULT_VOCABULARY = DefaultVocabulary()
