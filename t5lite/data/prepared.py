"""Reading what `t5lite prepare` wrote: ArrayRecord shards of {"text", "url"} documents + manifest.json.

`PreparedShards(data_dir)` is a random-access sequence (`len`, `[i]`, `__getitems__`), so a loader
can sample indices and shard by replica without reading ahead; records are numbered shard after
shard in the manifest's order. `PreparedSource` makes it a task source: a task reads the prepared
documents when its data_dir holds a manifest for the split (`data_dir/manifest.json`, or
`data_dir/<split>/manifest.json` for one folder per split), else its fallback source.
"""
from __future__ import annotations

import bisect
import dataclasses
import json
import os
from typing import Any, Iterator, Sequence

from etils import epath

from t5lite import storage
from t5lite.data.registry import Example, _check_split, shuffle_and_shard
from t5lite.errors import DataError, DataNotFoundError

MANIFEST = "manifest.json"
FORMAT = "t5lite-prepared-v1"


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.array_record"


def find_manifest(data_dir: str, split: str) -> str | None:
    """The manifest of `split` under `data_dir`, or None when data_dir holds no prepared data.

    A manifest in either place for another split is an error: falling back would read other data.
    """
    for folder in (os.path.join(data_dir, split), data_dir):
        path = os.path.join(folder, MANIFEST)
        if epath.Path(path).is_file():
            prepared_split = _read_manifest(path).get("split")
            if prepared_split == split:
                return path
            raise DataNotFoundError(
                f"{path} holds the prepared split {prepared_split!r}, not {split!r}: prepare {split!r} with "
                f"`t5lite prepare --split {split} --output {os.path.join(data_dir, split)} ...` (put each split "
                "in its own data_dir/<split> folder)")
    return None


def _read_manifest(path: str) -> dict:
    try:
        manifest = json.loads(epath.Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read the prepare manifest ({e}); run `t5lite prepare` again") from e
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path}: not a `t5lite prepare` manifest (format {manifest.get('format')!r}, "
                        f"expected {FORMAT!r})")
    return manifest


class PreparedShards(Sequence[dict]):
    """The documents of a prepared folder: `[i]` -> {"text": ..., "url": ...}.

    Opening checks every shard (present, readable, as many records as the manifest says), so a
    truncated or missing shard fails here, naming the file and the fix. Picklable: worker processes
    reopen the files.
    """

    def __init__(self, data_dir: str):
        if storage.is_remote(data_dir):
            raise DataError(f"data_dir {data_dir}: prepared shards are read from a local folder (ArrayRecord reads "
                            f"local files only); copy them to each host first, e.g. `gcloud storage cp -r "
                            f"{data_dir} DIR`, and set data_dir to DIR")
        self.data_dir = data_dir
        path = os.path.join(data_dir, MANIFEST)
        if not os.path.isfile(path):
            raise DataNotFoundError(f"{data_dir} holds no {MANIFEST}: it is not a prepared folder; create one with "
                                    f"`t5lite prepare --input 'RAW/*.jsonl.gz' --output {data_dir}`")
        manifest = _read_manifest(path)
        command = manifest.get("command", "t5lite prepare ...")
        if manifest.get("status") != "complete":
            raise DataError(f"{path}: the preparation did not finish; rerun `{command}` to complete it")
        self.manifest = manifest
        self.paths = [os.path.join(data_dir, s["file"]) for s in manifest["shards"]]
        self.sizes = [int(s["records"]) for s in manifest["shards"]]
        self._starts = [sum(self.sizes[:i]) for i in range(len(self.sizes) + 1)]
        self._readers: list[Any] | None = None
        self._open(command)

    def _open(self, command: str = "t5lite prepare ...") -> list[Any]:
        from array_record.python.array_record_module import ArrayRecordReader
        if self._readers is None:
            readers = []
            for path, size in zip(self.paths, self.sizes):
                fix = f"prepare the data again (`{command}` with a new --output folder)"
                if not os.path.isfile(path):
                    raise DataError(f"{path}: shard missing ({size} records expected); {fix}")
                reader = ArrayRecordReader(path)
                found = reader.num_records() if reader.ok() else None
                if found != size:
                    state = "unreadable (truncated or damaged)" if found is None else f"holds {found} records"
                    raise DataError(f"{path}: shard {state}, the manifest says {size} records; {fix}")
                readers.append(reader)
            self._readers = readers
        return self._readers

    def __len__(self) -> int:
        return self._starts[-1]

    def _locate(self, index: int) -> tuple[int, int]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"document {index} out of range: {self.data_dir} holds {len(self)}")
        index %= len(self)
        shard = bisect.bisect_right(self._starts, index) - 1
        return shard, index - self._starts[shard]

    def __getitem__(self, index: int) -> dict:
        shard, position = self._locate(index)
        return json.loads(self._open()[shard].read([position])[0])

    def __getitems__(self, indices: Sequence[int]) -> list[dict]:
        """Several documents, one read per shard (grain calls this for a batch of indices)."""
        located = [self._locate(int(i)) for i in indices]
        wanted: dict[int, list[int]] = {}
        for shard, position in located:
            wanted.setdefault(shard, []).append(position)
        records = {shard: dict(zip(positions, self._open()[shard].read(positions)))
                   for shard, positions in wanted.items()}
        return [json.loads(records[shard][position]) for shard, position in located]

    def __iter__(self) -> Iterator[dict]:
        """Every document in order, each shard read sequentially."""
        for reader in self._open():
            for record in reader.read_all():
                yield json.loads(record)

    def __getstate__(self):
        return {**self.__dict__, "_readers": None}

    def __repr__(self):
        return f"PreparedShards({self.data_dir!r}, {len(self)} documents in {len(self.paths)} shards)"


@dataclasses.dataclass
class PreparedSource:
    """A task source: the documents `t5lite prepare` wrote when data_dir holds them, else `fallback`.

    `PreparedSource()` alone reads prepared data only (a missing manifest is an error naming the fix);
    `PreparedSource(fallback=TfdsSource("c4/en", ...))` is `c4_span_corruption`'s source.
    """
    fallback: Any = None
    default_splits: Sequence[str] = ("train", "validation")

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.fallback.splits if self.fallback is not None else self.default_splits)

    def shards(self, split: str, data_dir: str | None) -> PreparedShards | None:
        _check_split(self, split)
        manifest = find_manifest(data_dir, split) if data_dir else None
        if manifest is None and self.fallback is None:
            where = data_dir or "(no data_dir given)"
            raise DataNotFoundError(f"no prepared {split!r} data in {where}: expected {MANIFEST} there (or in "
                                    f"<data_dir>/{split}/); create it with `t5lite prepare --input 'RAW/*.jsonl.gz' "
                                    f"--split {split} --output DIR` and set data_dir to DIR")
        return PreparedShards(os.path.dirname(manifest)) if manifest else None

    def num_examples(self, split: str, data_dir: str | None = None) -> int:
        shards = self.shards(split, data_dir)
        return len(shards) if shards is not None else self.fallback.num_examples(split, data_dir=data_dir)

    def records(self, split: str, data_dir: str | None = None):
        """The prepared documents by index (random access: the grain loader resumes in O(1)), else the
        fallback's records."""
        shards = self.shards(split, data_dir)
        return shards if shards is not None else self.fallback.records(split, data_dir=data_dir)

    def load(self, split, *, data_dir=None, shuffle=False, seed=0, shard_index=0, shard_count=1) -> Iterator[Example]:
        return shuffle_and_shard(self.records(split, data_dir), shuffle=shuffle, seed=seed, shard_index=shard_index,
                                 shard_count=shard_count)
