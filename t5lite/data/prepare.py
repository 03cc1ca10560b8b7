"""`t5lite prepare`: raw text files -> C4-cleaned, line-de-duplicated ArrayRecord shards + manifest.json.

Input files are JSON lines (a name ending in .jsonl or .json, optionally .gz: one object per line
with a `text` and an optional `url`) or plain text (any other name, optionally .gz: the whole file
is one document, blank lines being paragraph breaks, as a crawled page is). An input may also be a
registered task (`task:NAME:SPLIT=DATA_DIR`, `task_documents`): its records' text, without labels,
one document per record; curated text, it skips C4's page and line filters, sentence count and
language check, and is de-duplicated with the rest. The work is two passes, each input one unit of
work for a pool of worker processes:

1. clean: drop pages over `max_page_length` characters, apply C4's line and page filters
   (`c4.clean_page`), keep the survivors in a work file and record each kept line's owner in
   `LineOwners`, a disk-backed store (sqlite files by hash bucket) whose memory does not grow with
   the corpus.
2. filter: keep the lines a page owns (first copy only), then, as TFDS, drop pages left under
   `min_num_sentences` sentences, non-English pages (`langdetect`) and pages with a bad word; write
   the rest, in input order, to shard i of input file i.

A line's owner is the page with the smallest (md5(url), file index, line number): TFDS's rule (the
smallest md5 of the URL), ties broken by position, so each line is kept exactly once across the
corpus and pages without a URL keep the first copy. TFDS's step that keeps only the newest page per
normalised URL is not applied. The output depends on the inputs and options only, never on the
number of workers.

The manifest's counts: every input document is kept or counted under the one `page_*` filter that
dropped it; `line_*` count the lines each line filter removed from pages kept by cleaning, and
`line_duplicate` the copies de-duplication removed.

Restart: the manifest lists each finished unit of work; every file is written under a temporary
name and renamed when complete, and adding a line owner twice changes nothing, so a run killed at
any point continues where it stopped and ends with the output of an uninterrupted run. The manifest
also records each input's size and modification time: an input that changed before the run finished
has its cleaning redone, and since line ownership spans all files, the owner store is rebuilt from
the other files' cleaned pages and every shard is filtered again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import gzip
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import sqlite3
import struct
import threading
import zlib
from collections import Counter
from typing import Iterable, Iterator, Sequence

from etils import epath

from t5lite import storage, writable
from t5lite.data import c4, task_documents
from t5lite.data.prepared import FORMAT, MANIFEST, shard_name
from t5lite.data.sources import JsonLines, Malformed, open_file
from t5lite.data.vocab import default_cache_dir
from t5lite.errors import ConfigError, DataError

JSON_SUFFIXES = (".jsonl", ".json")
PAGE_REASONS = ("page_too_long", "page_lorem_ipsum", "page_curly_brace", "page_too_few_sentences",
                "page_too_few_sentences_after_dedupe", "page_empty_after_dedupe", "page_not_english", "page_bad_words")
LINE_REASONS = ("line_long_word", "line_no_end_mark", "line_too_few_words", "line_javascript", "line_policy",
                "line_duplicate")
TOTALS = ("documents_in", "characters_in", "documents_kept", "characters_kept")
WORK_DIR = "work"
log = logging.getLogger("t5lite.prepare")


@dataclasses.dataclass(frozen=True)
class Options:
    """The cleaning settings (C4's by default); they are part of what a restart must match."""
    min_words_per_line: int = c4.MIN_WORDS_PER_LINE
    min_num_sentences: int = c4.MIN_NUM_SENTENCES
    max_word_length: int = c4.MAX_WORD_LENGTH
    max_page_length: int = int(c4.MAX_PAGE_LENGTH)
    language_filter: bool = True
    bad_words: tuple[str, ...] = ()

    def describe(self) -> dict:
        """The options as the manifest records them: the bad words by count and digest only."""
        described = dataclasses.asdict(self)
        words = "\n".join(sorted(set(self.bad_words)))
        described["bad_words"] = {"count": len(set(self.bad_words)),
                                  "sha256": hashlib.sha256(words.encode("utf-8")).hexdigest()}
        return described


def read_bad_words(path: str) -> tuple[str, ...]:
    """One bad word or phrase per line (C4 used the LDNOOBW English list)."""
    try:
        text = epath.Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"--bad_words {path}: cannot read it ({e}); give a UTF-8 file with one word per line") from e
    return tuple(w.strip() for w in text.splitlines() if w.strip())


# ----------------------------------------------------------------------------- reading documents

def read_documents(path: str) -> Iterator[tuple[int, str, str]]:
    """(line number, url, text) of each document in `path`; a plain-text file is one document, line 0;
    a task input (`task:NAME:SPLIT=DATA_DIR`) gives one document per record (`task_documents`).

    A damaged file is a DataError naming it: a truncated gzip, bytes that are not UTF-8, a JSON line
    that is not an object with a string `text`.
    """
    if task_documents.is_task(path):
        yield from task_documents.TaskInput.parse(path).documents()
        return
    try:
        if path.removesuffix(".gz").endswith(JSON_SUFFIXES):
            for number, row in JsonLines()(path):
                if isinstance(row, Malformed):
                    raise DataError(f"{path}:{number}: {row.reason}; fix the line or remove the file from --input")
                text, url = row.get("text"), row.get("url") or ""
                if not isinstance(text, str) or not isinstance(url, str):
                    raise DataError(f"{path}:{number}: expected a string `text` and optionally a string `url`, got "
                                    f"keys {sorted(row)}; fix the line or remove the file from --input")
                yield number, url, text
        else:
            with open_file(path) as f:
                data = f.read()
            try:
                yield 0, "", data.decode("utf-8-sig")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}: not UTF-8 ({e.reason} at byte {e.start}); convert it, e.g. "
                                f"`iconv -f latin1 -t utf-8`") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: damaged or truncated gzip file ({type(e).__name__}: {e}); compress it again "
                        "or remove it from --input") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror or e}); fix its permissions or remove it from "
                        "--input") from None


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """The local files the --input patterns (globs, `**` included, or paths) name, sorted, then the task
    inputs in the order given; a pattern naming none, or a task without the split's data, is an error."""
    files, tasks = set(), []
    for pattern in patterns:
        if task_documents.is_task(pattern):
            task = task_documents.TaskInput.parse(pattern)
            task.source().records(task.split, task.data_dir)   # fails now, naming the files it needs
            tasks.append(str(task))
            continue
        matches = [path for path in glob.glob(pattern, recursive=True) if os.path.isfile(path)]
        if not matches:
            raise DataError(f"--input {pattern}: no file matches; give text or JSON-lines files, e.g. "
                            "--input 'crawl/*.jsonl.gz'")
        files.update(matches)
    return sorted(files) + list(dict.fromkeys(tasks))


# ----------------------------------------------------------------------------- line owners on disk

class LineOwners:
    """line key -> the key of the page that keeps the line, in `buckets` sqlite files under `folder`.

    On disk, so memory stays flat however many lines the corpus has; several processes may add at
    once (sqlite locks each file). `add` keeps the smaller page key, so adding the same pairs again,
    as a restarted run does, changes nothing.
    """
    UPSERT = ("INSERT INTO owner VALUES (?, ?) ON CONFLICT(line) DO UPDATE SET page = excluded.page "
              "WHERE excluded.page < owner.page")
    LOOKUP_CHUNK = 500  # keys per SELECT (sqlite's bound-variable limit is far above)

    def __init__(self, folder: str, buckets: int):
        self.folder, self.buckets = folder, buckets
        self._connections: dict[int, sqlite3.Connection] = {}

    def create(self) -> None:
        """Creates the bucket files (once, before workers connect: switching to WAL needs them alone).

        WAL with synchronous=NORMAL survives a killed process (not a power loss) without an fsync per commit.
        """
        os.makedirs(self.folder, exist_ok=True)
        for bucket in range(self.buckets):
            db = self._db(bucket)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS owner (line BLOB PRIMARY KEY, page BLOB NOT NULL) WITHOUT ROWID")
        self.close()

    def _db(self, bucket: int) -> sqlite3.Connection:
        if bucket not in self._connections:
            db = sqlite3.connect(os.path.join(self.folder, f"owners-{bucket:04d}.sqlite"), timeout=600)
            db.execute("PRAGMA synchronous=NORMAL")
            self._connections[bucket] = db
        return self._connections[bucket]

    def _bucket(self, key: bytes) -> int:
        return int.from_bytes(key[:4], "big") % self.buckets

    def add(self, owners: dict[bytes, bytes]) -> None:
        """Adds {line key: page key} pairs, one transaction per bucket."""
        by_bucket: dict[int, list] = {}
        for line, page in owners.items():
            by_bucket.setdefault(self._bucket(line), []).append((line, page))
        for bucket, rows in sorted(by_bucket.items()):
            with self._db(bucket) as db:
                db.executemany(self.UPSERT, rows)

    def lookup(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        by_bucket: dict[int, list] = {}
        for key in set(keys):
            by_bucket.setdefault(self._bucket(key), []).append(key)
        found = {}
        for bucket, wanted in by_bucket.items():
            for start in range(0, len(wanted), self.LOOKUP_CHUNK):
                chunk = wanted[start:start + self.LOOKUP_CHUNK]
                query = f"SELECT line, page FROM owner WHERE line IN ({','.join('?' * len(chunk))})"
                found.update(self._db(bucket).execute(query, chunk).fetchall())
        return found

    def close(self) -> None:
        for db in self._connections.values():
            db.close()
        self._connections.clear()


# ----------------------------------------------------------------------------- the two passes

def _work_file(output: str, index: int) -> str:
    """Pass 1's output for input file `index`: its cleaned pages with their keys, as JSON lines."""
    return os.path.join(output, WORK_DIR, "clean", f"{index:05d}.jsonl")


@dataclasses.dataclass(frozen=True)
class Job:
    """One input file's unit of work in either pass."""
    index: int
    path: str
    output: str
    shard: str
    buckets: int
    options: Options

    @property
    def curated(self) -> bool:
        """A task's text is curated already: C4's filters for crawled pages (line and page heuristics,
        sentences, language) do not apply to it; line de-duplication and bad words do."""
        return task_documents.is_task(self.path)

    @property
    def work_file(self) -> str:
        return _work_file(self.output, self.index)

    @property
    def owners(self) -> LineOwners:
        return LineOwners(os.path.join(self.output, WORK_DIR, "owners"), self.buckets)


OWNER_BATCH = 100_000  # line owners buffered in memory before they go to disk
_progress = None  # documents done, shared with the main process's progress bar


def _init_worker(progress) -> None:
    global _progress
    _progress = progress


def _tick(n: int) -> None:
    if _progress is not None:
        with _progress.get_lock():
            _progress.value += n


def page_key(url: str, file_index: int, line: int) -> bytes:
    """What decides which copy of a line is kept: the smallest (md5(url), file index, line number)."""
    return c4.md5(url) + struct.pack(">II", file_index, line)


@contextlib.contextmanager
def _written_atomically(path: str):
    """Writes to `path.incomplete` and renames it to `path` only when the block finishes."""
    temp = path + ".incomplete"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    yield temp
    os.replace(temp, path)


def _claim_lines(owners_batch: dict[bytes, bytes], cleaned: str, key: bytes) -> None:
    """Records page `key` as the owner of each of its lines, unless a smaller key holds it."""
    for line in cleaned.split("\n"):
        line = c4.line_key(line)
        if line not in owners_batch or key < owners_batch[line]:
            owners_batch[line] = key


def clean_file(job: Job) -> dict:
    """Pass 1 for one file: C4's page and line filters; survivors to the work file, line owners to disk."""
    counts, owners_batch, owners = Counter(), {}, job.owners
    opts = job.options
    with _written_atomically(job.work_file) as temp, open(temp, "w", encoding="utf-8") as out:
        for number, url, text in read_documents(job.path):
            counts["documents_in"] += 1
            counts["characters_in"] += len(text)
            _tick(1)
            if len(text) > opts.max_page_length:
                counts["page_too_long"] += 1
                continue
            cleaned = text if job.curated else c4.clean_page(
                text, min_words_per_line=opts.min_words_per_line, min_num_sentences=opts.min_num_sentences,
                max_word_length=opts.max_word_length, counts=counts)
            if cleaned is None:
                continue
            key = page_key(url, job.index, number)
            _claim_lines(owners_batch, cleaned, key)
            out.write(json.dumps({"key": key.hex(), "url": url, "text": cleaned}, ensure_ascii=False) + "\n")
            counts["cleaned"] += 1
            if len(owners_batch) >= OWNER_BATCH:
                owners.add(owners_batch)
                owners_batch = {}
        owners.add(owners_batch)
    owners.close()
    return dict(counts)


def filter_file(job: Job) -> dict:
    """Pass 2 for one file: keep owned lines, re-check sentences, language, bad words; write its shard."""
    from array_record.python.array_record_module import ArrayRecordWriter
    counts, owners, opts = Counter(), job.owners, job.options
    no_badwords = c4.badword_filter(opts.bad_words)
    with _written_atomically(os.path.join(job.output, job.shard)) as temp:
        writer = ArrayRecordWriter(temp, "group_size:1")  # group size 1: each record read on its own
        with open(job.work_file, encoding="utf-8") as f:
            for row in map(json.loads, f):
                _tick(1)
                lines = row["text"].split("\n")
                owner = owners.lookup(map(c4.line_key, lines))
                text = c4.keep_owned_lines(row["text"], bytes.fromhex(row["key"]), owner)
                counts["line_duplicate"] += len(lines) - (text.count("\n") + 1 if text else 0)
                if job.curated and not text:
                    counts["page_empty_after_dedupe"] += 1
                elif not job.curated and not c4.enough_sentences(text, min_num_sentences=opts.min_num_sentences):
                    counts["page_too_few_sentences_after_dedupe"] += 1
                elif opts.language_filter and not job.curated and not c4.langdetect_english(text):
                    counts["page_not_english"] += 1
                elif not no_badwords(text):
                    counts["page_bad_words"] += 1
                else:
                    writer.write(json.dumps({"text": text, "url": row["url"]}, ensure_ascii=False).encode("utf-8"))
                    counts["documents_kept"] += 1
                    counts["characters_kept"] += len(text)
        writer.close()
    owners.close()
    return dict(counts)


# ----------------------------------------------------------------------------- the run

def _save(manifest: dict, output: str) -> None:
    """Replaces the manifest atomically (its draft lives in the work folder, which goes at the end)."""
    os.makedirs(os.path.join(output, WORK_DIR), exist_ok=True)
    draft = os.path.join(output, WORK_DIR, MANIFEST)
    with open(draft, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    os.replace(draft, os.path.join(output, MANIFEST))


def _stat(path: str) -> list[int]:
    """What tells a changed input file: its size and modification time (ns)."""
    if task_documents.is_task(path):
        return task_documents.TaskInput.parse(path).stat()
    info = os.stat(path)
    return [info.st_size, info.st_mtime_ns]


def _start(files: list[str], output: str, split: str, options: Options, workers: int, command: str) -> dict:
    """The manifest of a new run, or of the unfinished run in `output` if it has the same inputs and options."""
    fresh = {"format": FORMAT, "status": "running", "split": split, "inputs": files, "options": options.describe(),
             "input_stats": [_stat(path) for path in files], "line_owner_buckets": max(16, 2 * workers),
             "command": command, "cleaned": {}, "filtered": {}}
    path = os.path.join(output, MANIFEST)
    if not os.path.exists(path):
        writable.ensure_new_dir(output, "--output")
        _save(fresh, output)
        return fresh
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    differs = [k for k in ("format", "split", "inputs", "options") if manifest.get(k) != fresh[k]]
    if differs:
        raise ConfigError(f"--output {output} holds a preparation with other {', '.join(differs)} "
                          f"(it was `{manifest.get('command')}`); rerun that command to finish it, or give a new "
                          "--output folder")
    recorded = manifest.get("input_stats") or fresh["input_stats"]
    changed = [i for i, path in enumerate(files) if recorded[i] != fresh["input_stats"][i]]
    if changed and manifest["status"] == "complete":
        raise DataError(f"--input {files[changed[0]]} changed after the preparation in --output {output} finished "
                        f"({_change(recorded[changed[0]], fresh['input_stats'][changed[0]])}); its shards are of the "
                        "old file: prepare again into a new --output folder")
    manifest["input_stats"] = fresh["input_stats"]
    if changed:
        _invalidate(manifest, [i for i in changed if str(i) in manifest["cleaned"]], recorded, output)
    return manifest


def _change(old: list[int], new: list[int]) -> str:
    return f"size {old[0]} -> {new[0]} bytes" if old[0] != new[0] else "modified since"


def _invalidate(manifest: dict, changed: list[int], recorded: list, output: str) -> None:
    """Redoes the work that depends on inputs changed since they were cleaned: their cleaning, the
    line owner store (rebuilt from the unchanged files' cleaned pages) and every shard's filtering."""
    if not changed:
        return
    first = changed[0]
    log.warning("--input %s changed since this preparation cleaned it (%s): cleaning it again, and, since line "
                "de-duplication spans all files, filtering every shard again",
                ", ".join(manifest["inputs"][i] for i in changed),
                _change(recorded[first], manifest["input_stats"][first]))
    for i in changed:
        del manifest["cleaned"][str(i)]
    manifest["filtered"] = {}
    owners = LineOwners(os.path.join(output, WORK_DIR, "owners"), manifest["line_owner_buckets"])
    shutil.rmtree(owners.folder, ignore_errors=True)
    owners.create()
    for index in manifest["cleaned"]:
        batch = {}
        with open(_work_file(output, int(index)), encoding="utf-8") as f:
            for row in map(json.loads, f):
                _claim_lines(batch, row["text"], bytes.fromhex(row["key"]))
                if len(batch) >= OWNER_BATCH:
                    owners.add(batch)
                    batch = {}
        owners.add(batch)
    owners.close()
    _save(manifest, output)


def _call(fn_and_job: tuple) -> tuple[Job, dict]:
    fn, job = fn_and_job
    return job, fn(job)


def _run(fn, jobs: list[Job], pool, desc: str, total: int | None, progress: bool) -> Iterator[tuple[Job, dict]]:
    """(job, fn(job)) as each job finishes, with a progress bar in documents/s fed by the workers' counter."""
    from tqdm import tqdm
    _progress.value = 0
    bar = tqdm(desc=desc, total=total, unit="doc", disable=not progress, smoothing=0.1)
    stop = threading.Event()

    def refresh():
        while not stop.wait(0.5):
            bar.update(_progress.value - bar.n)

    ticker = threading.Thread(target=refresh, daemon=True)
    ticker.start()
    try:
        yield from (pool.imap_unordered if pool else map)(_call, [(fn, job) for job in jobs])
    finally:
        stop.set()
        ticker.join()
        bar.update(_progress.value - bar.n)
        bar.close()


def prepare(inputs: Sequence[str], output: str, workers: int = 1, options: Options = Options(), split: str = "train",
            progress: bool = True, command: str = "") -> dict:
    """Cleans and de-duplicates the documents of `inputs` (globs or paths) into `output`; returns the manifest.

    Rerun on an unfinished `output` with the same inputs and options, it continues where it stopped.
    """
    if workers < 1:
        raise ConfigError(f"--workers {workers}: give at least 1")
    writable.check_name(split, "--split")
    files = expand_inputs(inputs)
    useful = min(len(files), os.cpu_count() or 1)   # one input file is one unit of work
    if workers > useful:
        log.warning("--workers %d: using %d (%d input file(s), %d CPU(s))", workers, useful, len(files),
                    os.cpu_count() or 1)
        workers = useful
    command = command or f"t5lite prepare --input {' '.join(inputs)} --output {output}"
    if storage.is_remote(output):
        return _prepare_and_upload(inputs, output, workers, options, split, progress, command)
    manifest = _start(files, output, split, options, workers, command)
    if manifest["status"] != "complete":
        jobs = [Job(i, path, output, shard_name(split, i, len(files)), manifest["line_owner_buckets"], options)
                for i, path in enumerate(files)]
        jobs[0].owners.create()  # there is a job per input file, and at least one file
        context = multiprocessing.get_context("spawn")  # never fork a process that may hold JAX's threads
        counter = context.Value("q", 0)
        _init_worker(counter)
        pool = context.Pool(workers, _init_worker, (counter,)) if workers > 1 else None
        try:
            _pass(manifest, "cleaned", clean_file, [j for j in jobs if str(j.index) not in manifest["cleaned"]],
                  pool, "clean", None, progress, output)
            documents = sum(c.get("documents_in", 0) for c in manifest["cleaned"].values())
            if not documents:
                raise DataError(f"--input {' '.join(inputs)}: the {len(files)} file(s) hold no document; check the "
                                "files (JSON lines need a `text` field)")
            pending = [j for j in jobs if str(j.index) not in manifest["filtered"]]
            _pass(manifest, "filtered", filter_file, pending, pool, "filter",
                  sum(manifest["cleaned"][str(j.index)].get("cleaned", 0) for j in pending), progress, output)
        finally:
            if pool:
                pool.terminate()
        _finish(manifest, output)
    shutil.rmtree(os.path.join(output, WORK_DIR), ignore_errors=True)
    return manifest


def _prepare_and_upload(inputs, output: str, workers, options, split, progress, command) -> dict:
    """`prepare` into a local folder (the sqlite work files and the ArrayRecord writer need one), then
    the shards and, last, the manifest to the gs:// `output`, so a manifest there always has its
    shards. The local folder goes once the upload is done; until then a rerun continues in it."""
    local = os.path.join(default_cache_dir(), "prepare", hashlib.sha256(output.encode()).hexdigest()[:16])
    if not os.path.exists(local):
        writable.ensure_new_dir(output, "--output")
    manifest = prepare(inputs, local, workers, options, split, progress, command)
    for name in [s["file"] for s in manifest["shards"]] + [MANIFEST]:
        epath.Path(local, name).copy(epath.Path(output, name), overwrite=True)
    shutil.rmtree(local)
    return manifest


def _pass(manifest, stage, fn, jobs, pool, desc, total, progress, output) -> None:
    for job, result in _run(fn, jobs, pool, desc, total, progress):
        manifest[stage][str(job.index)] = result
        _save(manifest, output)


def _finish(manifest: dict, output: str) -> None:
    """Sums the per-file counts into `counts`, lists the shards in order, and marks the run complete."""
    counts = Counter({k: 0 for k in (*TOTALS, *PAGE_REASONS, *LINE_REASONS)})
    for per_file in (*manifest["cleaned"].values(), *manifest["filtered"].values()):
        counts.update({k: v for k, v in per_file.items() if k in counts})
    inputs = manifest["inputs"]
    shards = [{"file": shard_name(manifest["split"], i, len(inputs)), "input": path,
               "records": manifest["filtered"][str(i)].get("documents_kept", 0),
               "characters": manifest["filtered"][str(i)].get("characters_kept", 0)} for i, path in enumerate(inputs)]
    manifest.update(status="complete", counts=dict(counts), shards=shards)
    del manifest["cleaned"], manifest["filtered"]
    _save(manifest, output)
