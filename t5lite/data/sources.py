"""Where a task's raw examples come from: TFDS, local files, or either.

Every source follows `registry.Source`: `splits` and `load(split, *, data_dir, shuffle, seed,
shard_index, shard_count)`. A split is held in random-access form (a TFDS array_record data
source, or a local file read into a list), so `registry.shuffle_and_shard` can apply one seeded
permutation and give host `i` every `shard_count`-th example: shards are disjoint, together cover
the split, and the order is a pure function of the arguments, which is what makes a run resumable.
`records(split, data_dir)` hands out that random-access form itself (`registry.RandomAccess`), which
the training loader reads through grain without materialising a permutation.

Local files (TSV/CSV tables, JSON lines, plain text, aligned parallel text, CoNLL columns; task modules add their
datasets' own layouts) are read into the same feature dicts TFDS yields, so one task's preprocessors
serve both. A row that does not parse is reported as `path:line: reason`; the malformed-row policy
("fail", the default, or "skip") decides whether it stops the load, and the skipped rows of a file
are counted in one warning. The policy is a gin setting (`malformed_rows.policy = 'skip'`). A split
that yields no example at all (empty files, or every row skipped) is an error naming its files.
"""
from __future__ import annotations

import codecs
import contextlib
import csv
import dataclasses
import gzip
import importlib
import io
import itertools
import json
import logging
import re
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import gin
import numpy as np
from etils import epath

from t5lite.data.registry import Example, RandomAccess, _check_split, shuffle_and_shard
from t5lite.errors import DataError, DataNotFoundError

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- malformed rows

POLICIES = ("fail", "skip")
_default_policy = "fail"


@gin.configurable("malformed_rows")
def malformed_policy(policy: str | None = None) -> str:
    """What file sources without their own `on_malformed` do with a bad row: "fail" or "skip".

    Set it in gin (`malformed_rows.policy = 'skip'`, or `--gin.malformed_rows.policy="'skip'"`);
    unset, it is `set_malformed_policy`'s value ("fail" by default)."""
    return _checked_policy(policy or _default_policy, "malformed_rows.policy")


def set_malformed_policy(policy: str) -> None:
    """Sets the policy from Python (a gin binding `malformed_rows.policy` takes precedence)."""
    global _default_policy
    _default_policy = _checked_policy(policy, "set_malformed_policy")


def _checked_policy(policy: str, where: str = "on_malformed") -> str:
    if policy not in POLICIES:
        raise DataError(f"{where} must be one of {POLICIES}, got {policy!r}")
    return policy


class MalformedRowError(DataError):
    """A row that does not parse, under the "fail" policy; the message starts with `path:line:`."""


class Malformed(NamedTuple):
    """What a reader yields instead of an example for a row that does not parse."""
    reason: str


Row = tuple[Any, "Example | Malformed"]  # (line number or other location, example or Malformed)


def read_rows(path: str, reader: Callable[[str], Iterator[Row]], policy: str) -> list[Example]:
    """All examples of one file; bad rows fail the load or are skipped and counted."""
    examples, skipped, first = [], 0, ""
    for where, row in reader(path):
        if not isinstance(row, Malformed):
            examples.append(row)
            continue
        message = f"{path}:{where}: {row.reason}"
        if policy == "fail":
            raise MalformedRowError(f"{message} (fix the row, or skip such rows with "
                                    "--gin.malformed_rows.policy=\"'skip'\")")
        skipped += 1
        first = first or message
    if skipped:
        log.warning("%s: skipped %d malformed row(s); the first: %s", path, skipped, first)
    return examples


# ----------------------------------------------------------------------------- readers

@contextlib.contextmanager
def open_file(path: str):
    """A binary file, local or remote (gs://...), decompressed when its name ends in ".gz"."""
    with epath.Path(path).open("rb") as f:
        yield gzip.GzipFile(fileobj=f) if str(path).endswith(".gz") else f


def _lines(path: str) -> Iterator[tuple[int, str | Malformed]]:
    """The file's lines numbered from 1, without newline or a leading UTF-8 byte-order mark.

    Split on "\\n" only, so text containing other line breaks (U+2028, U+0085) stays one row; a line
    that is not valid UTF-8 comes back as Malformed rather than failing the file.
    """
    with open_file(path) as f:
        for number, raw in enumerate(f, 1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                yield number, Malformed(f"not UTF-8 ({e.reason} at byte {e.start})")


def _csv_records(path: str, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """Quoted CSV records (fields may span lines), each with the line it starts on."""
    with open_file(path) as f:
        text = io.TextIOWrapper(f, encoding="utf-8-sig", newline="")
        records = csv.reader(text, delimiter=delimiter)
        start = 1
        for fields in records:
            yield start, fields
            start = records.line_num + 1


@dataclasses.dataclass(frozen=True)
class Table:
    """Rows of a TSV/CSV file as `{feature: value}` dicts, columns chosen by header name.

    `features` maps feature -> column name. A file whose first line lacks the needed names has no
    header; its columns are then named by `headerless` (CoLA's train and dev files). Features in
    `defaults` may be absent from the header (GLUE's test files have no label column). `convert`
    maps feature -> fn(str), raising ValueError on a bad value. With `quoted=False` a line is split
    on the delimiter with no quoting, and a lone "\\r" ends a line as "\\n" does, as TFDS reads GLUE
    (`csv` with QUOTE_NONE over a text-mode file; MRPC's text contains bare quotes); `quoted=True`
    reads CSV whose fields may contain quoted newlines. Rows are numbered into `index_key` from 0,
    malformed ones included (TFDS's `idx`); blank lines are ignored. A row with more fields than
    the header is malformed here; TFDS keeps it, read by position, though a stray tab has shifted
    the columns after it.
    """
    features: Mapping[str, str]
    convert: Mapping[str, Callable[[str], Any]] = dataclasses.field(default_factory=dict)
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    headerless: Sequence[str] | None = None
    delimiter: str = "\t"
    quoted: bool = False
    index_key: str | None = "idx"

    def _records(self, path: str) -> Iterator[tuple[int, list[str] | Malformed]]:
        if self.quoted:
            yield from _csv_records(path, self.delimiter)
            return
        for number, line in _lines(path):
            if isinstance(line, Malformed):
                yield number, line
                continue
            for part in line.split("\r"):
                yield number, part.split(self.delimiter) if part else []

    def _columns(self, path: str, first: list[str]) -> tuple[list[str], bool]:
        """(column names, whether `first` was the header)."""
        needed = {col for feat, col in self.features.items() if feat not in self.defaults}
        if needed <= set(first):
            return first, True
        if self.headerless is not None:
            return list(self.headerless), False
        raise DataError(f"{path}: expected a header naming the columns {sorted(needed)}, "
                         f"but the first line is {first[:12]}")

    def __call__(self, path: str) -> Iterator[Row]:
        records = ((n, r) for n, r in self._records(path) if r != [])
        first = next(records, None)
        if first is None:
            return
        if isinstance(first[1], Malformed):
            raise DataError(f"{path}:{first[0]}: cannot read the first line: {first[1].reason}")
        columns, had_header = self._columns(path, first[1])
        if not had_header:
            records = itertools.chain([first], records)
        position = {name: i for i, name in enumerate(columns)}
        for index, (number, fields) in enumerate(records):
            if isinstance(fields, Malformed):
                yield number, fields
            elif len(fields) != len(columns):
                yield number, Malformed(f"expected {len(columns)} fields {columns}, got {len(fields)}")
            else:
                yield number, self._example(fields, position, index)

    def _example(self, fields: list[str], position: Mapping[str, int], index: int) -> Example | Malformed:
        ex: Example = {}
        for feature, column in self.features.items():
            if column not in position:
                ex[feature] = self.defaults[feature]
                continue
            value = fields[position[column]]
            try:
                ex[feature] = self.convert[feature](value) if feature in self.convert else value
            except ValueError as e:
                return Malformed(f"bad {column!r} value {value!r}: {e}")
        if self.index_key:
            ex[self.index_key] = index
        return ex


@dataclasses.dataclass(frozen=True)
class JsonLines:
    """One JSON object per line; `features` maps feature -> key (None keeps every key as it is)."""
    features: Mapping[str, str] | None = None

    def __call__(self, path: str) -> Iterator[Row]:
        for number, line in _lines(path):
            if isinstance(line, Malformed):
                yield number, line
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                yield number, Malformed(f"not JSON: {e.msg} at column {e.colno}")
                continue
            if not isinstance(obj, dict):
                yield number, Malformed(f"expected a JSON object, got {type(obj).__name__}")
            elif self.features is None:
                yield number, obj
            elif missing := [k for k in self.features.values() if k not in obj]:
                yield number, Malformed(f"missing key(s) {missing}")
            else:
                yield number, {feature: obj[key] for feature, key in self.features.items()}


@dataclasses.dataclass(frozen=True)
class TextLines:
    """Each non-blank line of a plain-text file is one example `{key: line}`."""
    key: str = "text"

    def __call__(self, path: str) -> Iterator[Row]:
        for number, line in _lines(path):
            if isinstance(line, Malformed):
                yield number, line
            elif line.strip():
                yield number, {self.key: line}


@dataclasses.dataclass(frozen=True)
class ParallelText:
    """Aligned files `<prefix>.<lang>`: line i of each file together make example i, `{lang: line}`.

    Files of different lengths are misaligned as a whole, so that is an error, never a skipped row.
    """
    languages: Sequence[str]

    def paths(self, prefix: str) -> list[str]:
        return [f"{prefix}.{lang}" for lang in self.languages]

    def __call__(self, prefix: str) -> Iterator[Row]:
        for rows in itertools.zip_longest(*(_lines(p) for p in self.paths(prefix))):
            if None in rows:
                counts = {lang: sum(1 for _ in _lines(p)) for lang, p in zip(self.languages, self.paths(prefix))}
                raise DataError(f"{prefix}.*: the files are not aligned, line counts differ: {counts}")
            number = rows[0][0]
            bad = [line for _, line in rows if isinstance(line, Malformed)]
            yield number, bad[0] if bad else {lang: line for lang, (_, line) in zip(self.languages, rows)}


_CONLLU_NON_WORD = re.compile(r"\d+[-.]\d+$")   # CoNLL-U's multiword-token ("3-4") and empty-node ("5.1") ids


@dataclasses.dataclass(frozen=True)
class Conll:
    """Column files with one token per line and a blank line after each sentence: CoNLL-U, IOB2
    (Universal NER), CoNLL-2003. Each sentence is one example `{"id", "words", "tags"}`, the words
    from column `word_column` and the tags from `tag_column` (0-based, tab- or `delimiter`-split).

    Lines starting with "#" are comments; "# sent_id = X" gives the id (else "line N", where the
    sentence starts). With an id column first, CoNLL-U's multiword-token ("1-2") and empty-node
    ("1.1") lines are skipped, so the words are the syntactic words the tags belong to. A
    "-DOCSTART-" line (CoNLL-2003) is no sentence."""
    tag_column: int
    word_column: int = 1
    delimiter: str | None = "\t"    # None: any run of whitespace (CoNLL-2003's spaces)

    def __call__(self, path: str) -> Iterator[Row]:
        words, tags, start, sent_id, bad = [], [], None, None, None
        for number, line in [*_lines(path), (None, "")]:
            if isinstance(line, Malformed):
                bad = bad or line
                continue
            if not line.strip():
                if words or bad:
                    yield start, bad or {"id": sent_id or f"line {start}", "words": words, "tags": tags}
                words, tags, start, sent_id, bad = [], [], None, None, None
                continue
            start = start or number
            if line.startswith("#"):
                key, _, value = line[1:].partition("=")
                if key.strip() == "sent_id":
                    sent_id = value.strip()
                continue
            fields = line.split(self.delimiter)
            if fields[0] == "-DOCSTART-" or (self.word_column > 0 and _CONLLU_NON_WORD.match(fields[0])):
                continue
            if len(fields) <= max(self.word_column, self.tag_column):
                bad = bad or Malformed(f"line {number} has {len(fields)} columns; the tags are in column "
                                       f"{self.tag_column + 1}")
                continue
            words.append(fields[self.word_column])
            tags.append(fields[self.tag_column])


@dataclasses.dataclass(frozen=True)
class BySuffix:
    """Chooses the reader by the file name's ending, e.g. {".jsonl": JsonLines(), ".csv": Table(...)}."""
    readers: Mapping[str, Callable[[str], Iterator[Row]]]

    def __call__(self, path: str) -> Iterator[Row]:
        for suffix, reader in self.readers.items():
            if path.endswith(suffix):
                return reader(path)
        raise DataError(f"{path}: no reader for this kind of file; expected a name ending in {list(self.readers)}")


# ----------------------------------------------------------------------------- sources

_GLOB_CHARS = frozenset("*?[")


@dataclasses.dataclass
class FileSource:
    """Local files under `data_dir`; `split_files[split]` names the file(s) of each split.

    A name may be one path relative to `data_dir`, a glob (all matches are read, in sorted order),
    or a sequence of alternatives of which the first that exists is used. `reader(path)` yields
    `(line, example or Malformed)`; a reader with `paths(name)` (ParallelText) reads several files
    per name. `on_malformed` is "fail" or "skip" (None: `malformed_policy()`, the gin setting).
    """
    split_files: Mapping[str, str | Sequence[str]]
    reader: Callable[[str], Iterator[Row]]
    on_malformed: str | None = None

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.split_files)

    def files(self, split: str, data_dir: str) -> list[str]:
        """The paths to read for `split`, or [] when `data_dir` does not hold them."""
        names = self.split_files[split]
        for name in [names] if isinstance(names, str) else names:
            path = str(epath.Path(data_dir) / name)
            if _GLOB_CHARS & set(name):
                matches = sorted(str(p) for p in epath.Path(data_dir).glob(name))
                if matches:
                    return matches
            elif all(epath.Path(p).exists() for p in getattr(self.reader, "paths", lambda p: [p])(path)):
                return [path]
        return []

    def read(self, split: str, data_dir: str | None) -> list[Example]:
        """Every example of the split, in file order."""
        _check_split(self, split)
        if data_dir is None:
            raise DataNotFoundError(f"no data_dir given for split {split!r}: set data_dir to the folder holding "
                                    f"{self.split_files[split]!r}")
        paths = self.files(split, data_dir)
        if not paths:
            raise DataNotFoundError(f"no file for split {split!r} in {data_dir}: expected {self.split_files[split]!r}")
        policy = _checked_policy(self.on_malformed) if self.on_malformed else malformed_policy()
        examples = [ex for path in paths for ex in read_rows(path, self.reader, policy)]
        if not examples:
            why = "hold no rows" if policy == "fail" else "hold no rows that parse (see the skipped-row warning)"
            raise DataError(f"split {split!r} has no examples: {', '.join(paths)} {why}; check the file(s) or "
                            "point data_dir at the right folder")
        return examples

    def num_examples(self, split: str, data_dir: str | None = None) -> int:
        return len(self.read(split, data_dir))

    def records(self, split: str, data_dir: str | None = None) -> RandomAccess:
        """The split read once into memory, for random access."""
        return self.read(split, data_dir)

    def load(self, split, *, data_dir=None, shuffle=False, seed=0, shard_index=0, shard_count=1):
        return shuffle_and_shard(self.read(split, data_dir), shuffle=shuffle, seed=seed, shard_index=shard_index,
                                 shard_count=shard_count)


@contextlib.contextmanager
def _log_held(name: str):
    """Holds back what logger `name` logs inside the block; yields a function that logs it after all.
    When the block fails, its error says what went wrong and the held lines are dropped."""
    logger, held = logging.getLogger(name), []
    handler = logging.Handler()
    handler.emit = held.append
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(handler)
    try:
        yield lambda: [logger.handle(record) for record in held]
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


@dataclasses.dataclass
class TfdsSource:
    """A prepared TFDS dataset, read with `tfds.data_source` (array_record; no TensorFlow needed).

    `data_dir` is TFDS's (local, or gs://bucket/... on TPU VMs); None is TFDS's default. Nothing is
    downloaded: prepare the dataset first (`tfds build NAME --data_dir=...`). `module` is the TFDS
    module defining the builder: without TensorFlow installed, `import tensorflow_datasets` skips
    registering builders, so it is imported here by name.
    """
    name: str
    splits: Sequence[str] = ("train", "validation", "test")
    module: str | None = None

    def data_source(self, split: str, data_dir: str | None):
        """The split as TFDS's random-access sequence of numpy example dicts."""
        _check_split(self, split)
        try:
            import tensorflow_datasets as tfds  # imported only when a task actually reads TFDS
            if self.module:
                importlib.import_module(self.module)
        except ImportError as e:
            raise DataNotFoundError(f"TFDS {self.name!r} cannot be read here ({e}): "
                                    f"{self.prepare_hint(data_dir)}") from e
        try:
            with _log_held("absl") as replay:   # TFDS warns about the folders it looked in before failing
                source = tfds.data_source(self.name, split=split, data_dir=data_dir, download=False)
            replay()
            return source
        except Exception as e:  # TFDS raises several kinds (not found, not prepared, tfrecord format)
            raise DataNotFoundError(
                f"TFDS {self.name!r} split {split!r} is not prepared in {data_dir or 'the default TFDS data_dir'}: "
                f"{self.prepare_hint(data_dir)} ({_first_line(e)})") from e

    def prepare_hint(self, data_dir: str | None) -> str:
        try:
            import tensorflow_datasets  # noqa: F401
        except ImportError:
            return (f"pip install tensorflow-datasets and prepare it with `tfds build {self.name} "
                    f"--data_dir={data_dir or 'DIR'} --file_format=array_record`")
        return f"prepare it with `tfds build {self.name} --data_dir={data_dir or 'DIR'} --file_format=array_record`"

    def num_examples(self, split: str, data_dir: str | None = None) -> int:
        return len(self.data_source(split, data_dir))

    def records(self, split: str, data_dir: str | None = None) -> RandomAccess:
        """The prepared split by index, each record as plain Python (read on access, not loaded)."""
        return PythonRecords(self.data_source(split, data_dir))

    def load(self, split, *, data_dir=None, shuffle=False, seed=0, shard_index=0, shard_count=1):
        return shuffle_and_shard(self.records(split, data_dir), shuffle=shuffle, seed=seed, shard_index=shard_index,
                                 shard_count=shard_count)


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def to_python(value: Any) -> Any:
    """TFDS's numpy values as plain Python: bytes -> str, arrays -> lists, 0-d -> scalars."""
    if isinstance(value, Mapping):
        return {k: to_python(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, (np.ndarray, np.generic)):
        return to_python(value.tolist())
    if isinstance(value, list):
        return [to_python(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class PythonRecords:
    """A random-access sequence of TFDS numpy records, seen as plain Python values (`to_python`)."""
    data: RandomAccess

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Example:
        return to_python(self.data[index])


@dataclasses.dataclass
class FilesOrTfds:
    """One task, two ways to get its data: the local files when `data_dir` holds them, else TFDS."""
    files: FileSource
    tfds: TfdsSource

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.tfds.splits, *self.files.splits]))

    def _pick(self, split: str, data_dir: str | None):
        if data_dir is not None and split in self.files.splits and self.files.files(split, data_dir):
            return self.files
        return self.tfds

    def _call(self, method: str, split: str, data_dir: str | None, **kwargs):
        source = self._pick(split, data_dir)
        try:
            return getattr(source, method)(split, data_dir=data_dir, **kwargs)
        except FileNotFoundError as e:
            if source is self.files or split not in self.files.splits:
                raise
            where = f"in data_dir {data_dir}" if data_dir else "(no data_dir given)"
            raise DataNotFoundError(
                f"split {split!r} not found {where}: the task reads the local file(s) "
                f"{self.files.split_files[split]!r} under data_dir, or else the TFDS dataset {self.tfds.name!r}. "
                f"Point data_dir at the folder holding those files, or {self.tfds.prepare_hint(data_dir)} "
                f"(TFDS said {_first_line(e.__cause__ or e)})") from e

    def num_examples(self, split: str, data_dir: str | None = None) -> int:
        return self._call("num_examples", split, data_dir)

    def records(self, split: str, data_dir: str | None = None) -> RandomAccess:
        return self._call("records", split, data_dir)

    def load(self, split, *, data_dir=None, **kwargs):
        return self._call("load", split, data_dir, **kwargs)
