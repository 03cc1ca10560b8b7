"""Static word vectors on disk: word2vec text and binary files and GloVe text files, in and out.

Row order is the file's (for the released files: most frequent first), which analogy evaluation
relies on when it restricts the vocabulary to the first N words."""
from __future__ import annotations

import dataclasses
import functools
import string

import numpy as np
from etils import epath

from t5lite.errors import DataError

FORMATS = ("auto", "word2vec", "word2vec_binary", "glove")


@dataclasses.dataclass(frozen=True)
class WordVectors:
    """Words and their vectors, row i of `vectors` belonging to `words[i]`."""
    words: tuple[str, ...]
    vectors: np.ndarray

    def __post_init__(self):
        if self.vectors.ndim != 2 or len(self.words) != len(self.vectors):
            raise ValueError(f"{len(self.words)} words for vectors of shape {self.vectors.shape}")

    @functools.cached_property
    def index(self) -> dict[str, int]:
        """Word -> row; a word listed twice keeps its first row, as gensim does."""
        index = {}
        for i, word in enumerate(self.words):
            index.setdefault(word, i)
        return index

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self.index

    def __getitem__(self, word: str) -> np.ndarray:
        return self.vectors[self.index[word]]

    def vector_of(self, word: str) -> np.ndarray | None:
        """A word's vector, tried as written, then lowercased (GloVe's words are); None if it has neither."""
        form = word if word in self.index else word.lower()
        return self[form] if form in self.index else None

    def rows_of(self, text: str) -> list[int]:
        """The rows of a text's whitespace tokens that have one, tried as written, then without
        surrounding punctuation, then lower-cased (sentence-transformers' WhitespaceTokenizer's
        lookup, without its stop-word list); the others are skipped."""
        rows = []
        for token in text.split():
            for form in (token, token.strip(string.punctuation), token.strip(string.punctuation).lower()):
                if form and form in self.index:
                    rows.append(self.index[form])
                    break
        return rows

    def unit(self) -> np.ndarray:
        """The rows scaled to length 1 (a zero row stays zero)."""
        norms = np.linalg.norm(self.vectors, axis=1, keepdims=True)
        return self.vectors / np.where(norms == 0, 1, norms)


def _detect(path: epath.Path) -> str:
    if path.suffix == ".bin":
        return "word2vec_binary"
    with path.open("rb") as f:
        first = f.readline().split()
    return "word2vec" if len(first) == 2 and all(field.isdigit() for field in first) else "glove"


def _header(path: epath.Path, line: bytes) -> tuple[int, int]:
    """word2vec's `count dim` first line, refused when the file does not start with one."""
    fields = line.split()
    if len(fields) != 2 or not all(field.isdigit() for field in fields):
        raise DataError(f"{path}: line 1 is not a `count dim` header; is it a word2vec file?")
    return int(fields[0]), int(fields[1])


def _vector(fields: list[str], path, line_number: int) -> np.ndarray:
    """A row's numbers, refused unless they are finite numbers."""
    try:
        row = np.asarray(fields, dtype=np.float32)
    except ValueError:
        raise DataError(f"{path}: line {line_number} holds a word followed by something other than numbers; "
                        "pass a word2vec (.txt/.bin) or GloVe text file") from None
    if not np.isfinite(row).all():
        raise DataError(f"{path}: line {line_number} holds a NaN or infinite number; the vectors are damaged")
    return row


def _parse_rows(lines, dim: int | None, path, limit: int | None, first_line: int):
    words, rows = [], []
    for line_number, line in enumerate(lines, first_line):
        if limit is not None and len(words) >= limit:
            break
        fields = line.rstrip(" ").split(" ")
        if len(fields) < 2:
            continue
        dim = dim or len(fields) - 1
        if len(fields) - 1 != dim:
            raise DataError(f"{path}: line {line_number} has {len(fields) - 1} numbers, not {dim}; "
                            "is the file complete and in word2vec or GloVe text format?")
        words.append(fields[0])
        rows.append(_vector(fields[1:], path, line_number))
    return words, rows, dim


def _truncated(path, read: int, count: int) -> DataError:
    return DataError(f"{path} ends after {read} of the {count} vectors its header announces; the file is truncated")


def _load_text(path: epath.Path, has_header: bool, limit: int | None) -> WordVectors:
    lines = iter(path.read_bytes().decode("utf-8", errors="replace").splitlines())
    dim = None
    if has_header:
        count, dim = _header(path, next(lines, "").encode())
        limit = count if limit is None else min(limit, count)
    words, rows, dim = _parse_rows(lines, dim, path, limit, first_line=2 if has_header else 1)
    if has_header and len(rows) < limit:
        raise _truncated(path, len(rows), limit)
    if not rows:
        raise DataError(f"{path} holds no word vectors; pass a word2vec (.txt/.bin) or GloVe text file")
    return WordVectors(tuple(words), np.stack(rows))


def _load_binary(path: epath.Path, limit: int | None) -> WordVectors:
    data = path.read_bytes()
    header_end = data.find(b"\n")
    count, dim = _header(path, data[:header_end])
    count = count if limit is None else min(count, limit)
    words, vectors, at = [], np.empty((count, dim), np.float32), header_end + 1
    for row in range(count):
        space = data.find(b" ", at)
        if space < 0 or space + 1 + 4 * dim > len(data):
            raise _truncated(path, row, count)
        words.append(data[at:space].decode("utf-8", errors="replace").lstrip("\n"))
        vectors[row] = np.frombuffer(data, np.float32, dim, space + 1)
        at = space + 1 + 4 * dim
    return WordVectors(tuple(words), vectors)


def load_word_vectors(path, format: str = "auto", limit: int | None = None) -> WordVectors:
    """Read word2vec text (a `count dim` header line), word2vec binary or GloVe text (no header);
    `format="auto"` tells them apart by the `.bin` suffix and the header. `limit` keeps the first rows."""
    if format not in FORMATS:
        raise DataError(f"word vector format {format!r} is unknown; use one of {', '.join(FORMATS)}")
    path = epath.Path(path)
    if not path.exists():
        raise DataError(f"word vector file {path} does not exist")
    format = _detect(path) if format == "auto" else format
    if format == "word2vec_binary":
        return _load_binary(path, limit)
    return _load_text(path, has_header=format == "word2vec", limit=limit)


def save_word2vec(vectors: WordVectors, path, binary: bool = False) -> None:
    """Write the word2vec format (text or binary) that gensim and the original tools read."""
    header = f"{len(vectors)} {vectors.vectors.shape[1]}\n".encode()
    if binary:
        body = b"".join(word.encode() + b" " + row.astype("<f4").tobytes() + b"\n"
                        for word, row in zip(vectors.words, vectors.vectors))
    else:
        body = "".join(word + " " + " ".join(repr(float(x)) for x in row) + "\n"
                       for word, row in zip(vectors.words, vectors.vectors)).encode()
    epath.Path(path).write_bytes(header + body)
