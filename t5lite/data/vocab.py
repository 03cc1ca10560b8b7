"""Vocabularies behind one interface, the default one the built-in tasks use, and its identity.

Kinds (`vocabulary.kind` in gin): `sentencepiece` (this module; T5's), `byte_bpe` (GPT-2 / RoBERTa /
BART, t5lite.data.byte_bpe, through `tokenizers`), `bytes` (ByT5, t5lite.data.byte_vocab) and
`wordpiece` (BERT, t5lite.data.wordpiece). With `vocabulary.path = None` a tiny one of the kind is
trained on the embedded corpus on first use and cached.

T5 convention, kept by every vocabulary t5lite trains: pad 0, EOS 1, UNK 2, and `extra_ids`
sentinels at the top of the vocabulary, `<extra_id_0>` = vocab_size - 1 counting down.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import logging
import os
import tempfile
from typing import Iterable, Sequence

import gin
import numpy as np
import sentencepiece as spm
from google.protobuf.message import DecodeError
from sentencepiece import sentencepiece_model_pb2 as sp_pb2

from etils import epath

from t5lite.data.cache import default_cache_dir
from t5lite.data.corpus import embedded_documents
from t5lite.errors import CheckpointError, ConfigError, DataNotFoundError, T5liteError
from t5lite.run_layout import RunDir
from t5lite.storage import is_remote, write_atomically

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
TINY_VOCAB_SIZE = 2000   # pieces of the vocabularies trained on the embedded corpus (sentinels come on top)


class Vocabulary:
    """The interface every kind implements (WordPiece too, by duck typing).

    Attributes: `vocab_size` (ids, sentinels included), `pad_id`, `eos_id`, `unk_id`, `bos_id` and
    `mask_id` (None when the kind has none), `extra_ids` (number of sentinels).
    Methods: `sentinel_id(i)`, `encode(text) -> ids` (no EOS: the task appends it),
    `decode(ids) -> text` (stops at the first EOS, skips pad, ids past the vocabulary read as UNK),
    `encode_with_offsets(text) -> (ids, [(start, end)])` (character span of each id in `text`,
    whitespace trimmed; SQuAD maps answers with it), `id_to_piece(i)`.
    """
    vocab_size: int
    pad_id: int = PAD_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID
    bos_id: int | None = None
    mask_id: int | None = None
    extra_ids: int = 0

    def sentinel_id(self, i: int) -> int:
        if not 0 <= i < self.extra_ids:
            raise ValueError(f"sentinel {i} out of range: this vocabulary has {self.extra_ids} extra ids")
        return self.vocab_size - 1 - i

    def _clean(self, ids: Iterable[int]) -> list[int]:
        """What `decode` reads: up to the first EOS, pad dropped, ids past the vocabulary as UNK."""
        ids = [int(i) for i in ids]
        if self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return [self.unk_id if i >= self.vocab_size else i for i in ids if i != self.pad_id]


def trimmed_span(text: str, start: int, end: int) -> tuple[int, int]:
    """(start, end) without the whitespace at either end (an empty span stays where it starts)."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


class SentencePieceVocabulary(Vocabulary):
    """A SentencePiece model with `extra_ids` sentinels appended as user-defined pieces (as seqio does).

    Appending them to the model itself lets SentencePiece encode `<extra_id_N>` inside text and
    decode it back with the spacing around it intact. As in seqio the pieces are named
    `▁<extra_id_N>` (word-initial): `a <extra_id_0>ly` holds one sentinel id, while
    `jel<extra_id_0>ly` or `value<extra_id_0>` is plain text. `model_path=None` trains (once,
    cached) the tiny unigram model of the embedded corpus, with byte fallback so any script round-trips.
    """

    def __init__(self, model_path: str | None = None, extra_ids: int = 100):
        if model_path is None:
            model_path = train_sentencepiece(embedded_documents(), TINY_VOCAB_SIZE, byte_fallback=True)
        self.model_path = str(model_path)
        self.extra_ids = extra_ids
        proto = sp_pb2.ModelProto.FromString(epath.Path(self.model_path).read_bytes())
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

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.decode(self._clean(ids))

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """SentencePiece gives each piece's byte span in the UTF-8 text; turned into character spans.
        The bytes of one character split over byte-fallback pieces: the last piece holds the
        character, the others an empty span."""
        pieces = self._sp.encode(text, out_type="proto").pieces
        char_of_byte = np.zeros(len(text.encode("utf-8")) + 1, np.int64)
        position = 0
        for index, char in enumerate(text):
            width = len(char.encode("utf-8"))
            char_of_byte[position:position + width] = index
            position += width
        char_of_byte[position] = len(text)
        spans = [trimmed_span(text, int(char_of_byte[p.begin]), int(char_of_byte[p.end])) for p in pieces]
        return [p.id for p in pieces], spans

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))


def corpus_digest(texts: Sequence[str], settings: str) -> str:
    """A short hash of a training corpus and the training settings: the name of a cached vocabulary."""
    digest = hashlib.sha256()
    for t in texts:
        digest.update(t.encode("utf-8"))
        digest.update(b"\0")
    digest.update(settings.encode())
    return digest.hexdigest()[:12]


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
    digest = corpus_digest(texts, f"{vocab_size}-{model_type}-byte_fallback={byte_fallback}")
    out_dir = out_dir or os.path.join(default_cache_dir(), "vocab")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"spm_{model_type}_{vocab_size}{'_bytes' if byte_fallback else ''}_{digest}.model")
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
        with open(prefix + ".model", "rb") as src:
            write_atomically(path, src.read())
    return path


def padded_vocab_size(vocab_size: int, multiple: int = 128) -> int:
    """Embedding rows rounded up for TPU-friendly shapes (T5: 32100 -> 32128)."""
    return int(np.ceil(vocab_size / multiple) * multiple)


# --- kinds, and the default vocabulary the built-in tasks use.

KINDS = {  # kind -> "module:class"; each class takes (path=None, ...), None training the tiny one
    "sentencepiece": "t5lite.data.vocab:SentencePieceVocabulary",
    "byte_bpe": "t5lite.data.byte_bpe:ByteBPEVocabulary",
    "bytes": "t5lite.data.byte_vocab:ByteVocabulary",
    "wordpiece": "t5lite.data.wordpiece:WordPieceVocabulary",
}


def vocabulary_class(kind: str) -> type:
    if kind not in KINDS:
        raise ConfigError(f"vocabulary.kind={kind!r}: expected one of {sorted(KINDS)}")
    module, name = KINDS[kind].split(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        raise ConfigError(f"vocabulary.kind={kind!r} needs {module}, which cannot be imported here ({e})") from None


def kind_of(vocabulary) -> str:
    """The kind name of a vocabulary object (its class name for one t5lite does not know)."""
    name = type(resolved(vocabulary)).__name__
    return next((kind for kind, spec in KINDS.items() if spec.endswith(":" + name)), name)


def word_pieces(vocabulary, words: Sequence[str], space_first: bool = True) -> list[list[int]]:
    """Each word's subword ids, every word encoded on its own (as BERT and Hugging Face's `run_ner`
    split words, so each word owns its subwords). Byte-level BPE writes a word's start into its
    first piece ("Ġword"), so its words are encoded with a leading space: before every word, as Hugging
    Face tokenizers do with `add_prefix_space=True, is_split_into_words=True` (how `run_ner` loads
    RoBERTa / GPT-2), or with `space_first=False` not before the first, which gives exactly the
    pieces of the running text `" ".join(words)`. Other kinds mark continuations instead ("##",
    SentencePiece's "▁" is added by the model), so the flag changes nothing for them."""
    space = kind_of(vocabulary) == "byte_bpe"
    return [list(vocabulary.encode(" " + w if space and (i or space_first) else w)) for i, w in enumerate(words)]


def resolved(vocabulary):
    """The vocabulary itself, for `DEFAULT_VOCABULARY` the one it stands for now."""
    return vocabulary._resolve() if isinstance(vocabulary, DefaultVocabulary) else vocabulary


def make_vocabulary(kind: str = "sentencepiece", path: str | None = None, extra_ids: int | None = None):
    """A vocabulary of `kind` from `path` (None: the tiny one trained on the embedded corpus);
    `extra_ids` None keeps the kind's own default."""
    if path is not None and not epath.Path(path).exists():
        raise DataNotFoundError(f"vocabulary.path={path!r} ({kind}) does not exist; give the vocabulary's file or "
                                "folder, or None to train a tiny one on the embedded corpus")
    cls = vocabulary_class(kind)
    try:
        return cls(path) if extra_ids is None else cls(path, extra_ids=extra_ids)
    except T5liteError:
        raise
    except (OSError, ValueError, RuntimeError, UnicodeError, DecodeError) as e:   # the file is the user's
        raise ConfigError(f"vocabulary {path!r} is not a readable {kind} vocabulary ({_first_line(e)}); give a "
                          "SentencePiece .model file, a BERT vocab.txt, or a tokenizer.json / folder of a Hugging "
                          "Face tokenizer") from e


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


@dataclasses.dataclass(frozen=True)
class VocabularySettings:
    kind: str = "sentencepiece"
    path: str | None = None
    extra_ids: int | None = None
    allow_mismatch: bool = False


@gin.configurable("vocabulary")
def vocabulary_settings(kind: str = "sentencepiece", path: str | None = None, extra_ids: int | None = None,
                        allow_mismatch: bool = False) -> VocabularySettings:
    """What the built-in tasks (and `t5lite infer`) use: `vocabulary.kind`, `vocabulary.path` (None:
    train a tiny one on the embedded corpus), `vocabulary.extra_ids` (None: the kind's default).
    `vocabulary.allow_mismatch = True` lets a run use a checkpoint recorded with another vocabulary."""
    return VocabularySettings(kind, path, extra_ids, allow_mismatch)


_SETTINGS_KEY = ("", f"{__name__}.vocabulary")   # the unscoped `vocabulary` entry of gin's bindings table


def _gin_vocabulary_state() -> tuple | None:
    """The literal `vocabulary.*` bindings, read straight from gin's bindings table (gin announces
    no changes; its call, ~10-100 us, is too slow for every token list). None when the call is
    needed to be sure: under a gin scope (a scoped binding may apply) or a value given by a macro
    or a configurable."""
    if gin.current_scope():
        return None
    bindings = gin.config._CONFIG.get(_SETTINGS_KEY, {})
    if any(isinstance(v, gin.config.ConfigurableReference) for v in bindings.values()):
        return None
    return tuple(bindings.items())


class DefaultVocabulary:
    """The vocabulary the built-in tasks use, resolved from the gin `vocabulary` settings (or from
    `set_default_vocabulary`, which wins), built once per setting and cached.

    It sits in the tokenisation hot path, so the gin settings are read again only when gin's
    `vocabulary` bindings changed (on every use under a gin scope, or with a macro bound there).
    By default the 2000-piece unigram SentencePiece model (byte fallback) trained on the embedded
    corpus; point it at T5's public `spiece.model`, say, with `vocabulary.path` or
    `set_default_vocabulary`.
    """
    _explicit: VocabularySettings | None = None
    _from_run = False                            # `_explicit` is a run's own tokenizer (`use_run_vocabulary`)
    _built: dict = {}
    _gin_state: tuple | None = None              # the gin state `_gin_settings` was read in
    _gin_settings: VocabularySettings | None = None

    def settings(self) -> VocabularySettings:
        if DefaultVocabulary._explicit is not None:
            return DefaultVocabulary._explicit
        state = _gin_vocabulary_state()
        if state is None:
            return vocabulary_settings()
        if state != DefaultVocabulary._gin_state:
            DefaultVocabulary._gin_settings, DefaultVocabulary._gin_state = vocabulary_settings(), state
        return DefaultVocabulary._gin_settings

    def _resolve(self):
        s = self.settings()
        key = (s.kind, s.path, s.extra_ids)
        if key not in DefaultVocabulary._built:
            DefaultVocabulary._built[key] = make_vocabulary(*key)
        return DefaultVocabulary._built[key]

    def __getattr__(self, name):
        return getattr(self._resolve(), name)

    # Hash and compare as the vocabulary in use, so caches keyed on it follow a change of setting.
    def __hash__(self):
        return hash(self._resolve())

    def __eq__(self, other):
        return self._resolve() == (other._resolve() if isinstance(other, DefaultVocabulary) else other)

    def __repr__(self):
        s = self.settings()
        return f"DefaultVocabulary(kind={s.kind!r}, path={s.path!r})"   # path None: trained on the embedded corpus


def kind_of_file(path: str) -> str:
    """The vocabulary kind a file holds: BERT's `vocab.txt` is WordPiece, a `tokenizer.json` says its
    model type (WordPiece or byte-level BPE), a folder with `vocab.json` + `merges.txt` is byte-level
    BPE; anything else is read as a SentencePiece model."""
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "tokenizer.json")):
            return kind_of_file(os.path.join(path, "tokenizer.json"))
        return "wordpiece" if os.path.exists(os.path.join(path, "vocab.txt")) else "byte_bpe"
    if path.endswith(".txt"):
        return "wordpiece"
    if path.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as f:
                model_type = json.load(f).get("model", {}).get("type")
        except (OSError, ValueError, AttributeError) as e:
            raise ConfigError(f"vocabulary {path!r} is not a Hugging Face tokenizer.json ({_first_line(e)}); give "
                              "the tokenizer.json that save_pretrained writes") from e
        return "wordpiece" if model_type == "WordPiece" else "byte_bpe"
    return "sentencepiece"


def set_default_vocabulary(path: str | None, extra_ids: int = 100, kind: str | None = None) -> None:
    """Makes the built-in tasks use this vocabulary file (`kind` None: as `kind_of_file` reads it);
    `set_default_vocabulary(None)` goes back to the gin `vocabulary` settings (by default the
    embedded-corpus SentencePiece model)."""
    if path is not None and not epath.Path(path).exists():
        raise DataNotFoundError(f"vocabulary {path!r} does not exist; pass a SentencePiece .model file, a BERT "
                                "vocab.txt, or a tokenizer.json / folder of a Hugging Face tokenizer")
    kind = kind or (kind_of_file(path) if path is not None else "sentencepiece")
    extra_ids = extra_ids if kind == "sentencepiece" else None
    DefaultVocabulary._explicit = None if path is None else VocabularySettings(kind, path, extra_ids)
    DefaultVocabulary._from_run = False


DEFAULT_VOCABULARY = DefaultVocabulary()


# --- identity: which vocabulary a run was trained with.


def identity(vocabulary) -> dict:
    """Kind, size, special ids and a hash of every piece: equal exactly when two vocabularies map
    text to the same ids (wherever their files are)."""
    vocabulary = resolved(vocabulary)
    size = int(vocabulary.vocab_size)
    pieces = hashlib.sha256("\0".join(vocabulary.id_to_piece(i) for i in range(size)).encode("utf-8"))
    return {"kind": kind_of(vocabulary), "vocab_size": size, "pad_id": vocabulary.pad_id,
            "eos_id": vocabulary.eos_id, "pieces_sha256": pieces.hexdigest(), "description": repr(vocabulary)}


def record_identity(model_dir: str, vocabulary) -> None:
    """Writes `MODEL_DIR/vocabulary.json`, which resuming, fine-tuning, eval and infer check."""
    epath.Path(model_dir).mkdir(parents=True, exist_ok=True)
    write_atomically(RunDir(model_dir).vocabulary, json.dumps(identity(vocabulary), indent=1).encode())


def check_trainable(vocabulary) -> None:
    """The feature converters pad with 0 and weigh the loss on ids other than 0, so a vocabulary
    to train with must have its pad at 0 (GPT-2's own files put `!` there)."""
    if vocabulary.pad_id != PAD_ID:
        raise ConfigError(f"{resolved(vocabulary)!r} pads with id {vocabulary.pad_id} and has "
                          f"{vocabulary.id_to_piece(PAD_ID)!r} at id 0, but t5lite's feature converters pad with 0 "
                          "and drop id 0 from the loss; train with a vocabulary whose pad is 0 (every vocabulary "
                          "t5lite trains: vocabulary.path = None)")


def check_identity(model_dir: str | None, vocabulary, model_vocab_size: int | None = None,
                   allow_mismatch: bool | None = None) -> None:
    """Refuses `vocabulary` for the run in `model_dir` (None: no run) if it recorded another one, naming both,
    and a vocabulary with more ids than the model's embedding has rows (`model_vocab_size`).
    `allow_mismatch` (default: the gin `vocabulary.allow_mismatch`) lets the first pass."""
    if model_vocab_size is not None and vocabulary.vocab_size > model_vocab_size:
        raise ConfigError(f"the vocabulary has {vocabulary.vocab_size} ids but the model's embedding has "
                          f"{model_vocab_size} rows ({resolved(vocabulary)!r}); use a preset or "
                          f"`model_config.vocab_size` of at least {padded_vocab_size(vocabulary.vocab_size)}, or "
                          "the vocabulary the model was made for")
    if model_dir is None or not (path := RunDir(model_dir).vocabulary).exists():
        return
    recorded = json.loads(path.read_text(encoding="utf-8"))
    current = identity(vocabulary)
    differs = [k for k in ("kind", "vocab_size", "pad_id", "eos_id", "pieces_sha256") if recorded.get(k) != current[k]]
    if not differs:
        return
    if allow_mismatch is None:
        allow_mismatch = vocabulary_settings().allow_mismatch
    message = (f"{model_dir} was trained with the vocabulary {recorded['description']} ({recorded['kind']}, "
               f"{recorded['vocab_size']} ids) but this run uses {current['description']} ({current['kind']}, "
               f"{current['vocab_size']} ids); they differ in {', '.join(differs)}")
    if not allow_mismatch:
        raise CheckpointError(message + ". Set vocabulary.kind / vocabulary.path to the run's vocabulary, or "
                              "accept the change on purpose with --gin.vocabulary.allow_mismatch=True")
    logging.getLogger("t5lite").warning("%s (allowed)", message)


# --- a run's own tokenizer: a converted Hugging Face model carries the one it was made with.

TOKENIZER_FILES = ("spiece.model", "tokenizer.json", "vocab.txt", "vocab.json", "merges.txt",
                   "tokenizer_config.json", "special_tokens_map.json")


def tokenizer_file(folder: str) -> str | None:
    """What t5lite reads of a Hugging Face tokenizer folder: `spiece.model` (T5's, whose
    tokenizer.json is a Unigram t5lite does not read), `tokenizer.json`, `vocab.txt`, or the folder
    for GPT-2's `vocab.json` + `merges.txt`; None when it holds none of them. Of a folder in a
    bucket (a gs:// run's), the file of its local copy (`local_tokenizer_folder`)."""
    if is_remote(folder):
        folder = local_tokenizer_folder(folder)
        if folder is None:
            return None
    for name in ("spiece.model", "tokenizer.json", "vocab.txt"):
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    has_bpe = all(os.path.isfile(os.path.join(folder, n)) for n in ("vocab.json", "merges.txt"))
    return folder if has_bpe else None


def local_tokenizer_folder(folder: str) -> str | None:
    """A local copy of the tokenizer files of a folder in a bucket (SentencePiece and `tokenizers`
    open local files only), cached under a hash of the files so each version is fetched once;
    None when the folder holds none of them."""
    files = {name: (epath.Path(folder) / name).read_bytes() for name in TOKENIZER_FILES
             if (epath.Path(folder) / name).is_file()}
    if not files:
        return None
    digest = hashlib.sha256()
    for name, data in sorted(files.items()):
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    local = os.path.join(default_cache_dir(), "run_tokenizers", digest.hexdigest()[:16])
    os.makedirs(local, exist_ok=True)
    for name, data in files.items():
        if not os.path.isfile(os.path.join(local, name)):
            write_atomically(os.path.join(local, name), data)
    return local


def record_tokenizer(model_dir: str, hf_dir: str) -> str | None:
    """Copies the tokenizer files of `hf_dir` to `MODEL_DIR/tokenizer` and records that vocabulary
    in `vocabulary.json`, so commands on the run need no vocabulary flag (`use_run_vocabulary`).
    Either may be in a bucket. Returns the vocabulary file, or None (with a warning) when there is
    none t5lite can read."""
    if tokenizer_file(hf_dir) is None:
        return None
    target = RunDir(model_dir).tokenizer
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source := epath.Path(hf_dir) / name).is_file():
            write_atomically(target / name, source.read_bytes())
    path = tokenizer_file(str(target))
    try:
        record_identity(model_dir, make_vocabulary(kind_of_file(path), path))
    except T5liteError as e:
        target.rmtree()
        logging.getLogger("t5lite").warning("%s: its tokenizer is not recorded with the run (%s); pass the "
                                            "vocabulary to each command", hf_dir, e)
        return None
    return path


def use_run_vocabulary(vocabulary_path: str | None, model_dir: str | None) -> str | None:
    """Sets the vocabulary of a command on the run in `model_dir`: `vocabulary_path` when given,
    else, unless gin's `vocabulary.path` or `set_default_vocabulary` names one, the run's own
    tokenizer (`record_tokenizer`). Returns the run's tokenizer file when that is the one used."""
    if vocabulary_path is not None:
        set_default_vocabulary(vocabulary_path)
        return None
    own = tokenizer_file(str(RunDir(model_dir).tokenizer)) if model_dir else None
    named = vocabulary_settings().path is not None or (DefaultVocabulary._explicit is not None
                                                       and not DefaultVocabulary._from_run)
    if own is None or named:
        if own is None and DefaultVocabulary._from_run:   # not another run's tokenizer
            set_default_vocabulary(None)
        return None
    set_default_vocabulary(own)
    DefaultVocabulary._from_run = True
    return own
