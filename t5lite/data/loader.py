"""Deterministic, resumable batches for one data shard (a data-parallel replica group) of training.

A task whose source has random access (`records(split, data_dir)`) is read through grain: the
records are shuffled per epoch with grain's index shuffle (nothing materialised), this shard takes
every `shard_count`-th record of the endless stream, and consecutive records are grouped into
blocks of `block_size` that run through the task's preprocessors with a per-block seed (so a
preprocessor that turns documents into several examples, such as span corruption, sees whole
blocks), optionally in grain worker processes. The examples are then packed or padded into rows,
and rows into this shard's slice of the global batch. Greedy packing only depends on where a row
starts, so the position is (block, examples of it consumed): resuming reads one block, whatever
the step. A Mixture, or a source that can only stream, is read as a stream whose position is the
number of examples consumed (resuming replays them).

Processes whose devices share rows of the global batch (the same indices along the mesh's data
axes) must read the same shard, and each keeps the rows it holds: the trainer asks
`Partitioner.data_shard()`, passes it in, and builds the global batch with
`Partitioner.shard_batch()`.
"""
from __future__ import annotations

import collections
import itertools
from typing import Iterator, Mapping

import grain
import jax
import numpy as np

from t5lite.data import converter_registry, converters
from t5lite.data.registry import Mixture, Task
from t5lite.errors import ConfigError, DataError

EXAMPLES_KEY = converters.EXAMPLES_KEY


def _empty_error(task, split, shard_index, shard_count, data_dir) -> DataError:
    return DataError(f"task {task.name!r} split {split!r} yields no examples for shard {shard_index} of "
                     f"{shard_count} (data_dir={data_dir!r}): the split is empty, or its preprocessors drop "
                     "every example (e.g. all longer than the feature lengths); check the data and lengths")


# Examples a feature converter may take without making a row before the loader gives up: far more
# than a packed row ever needs, and reached in seconds by a converter that can make none (Skip-
# Thought on a corpus without two consecutive sentences), which would otherwise loop for ever.
EXAMPLES_WITHOUT_A_ROW = 100_000


class _RowWatch:
    """Counts the rows a converter makes from an example stream, and stops the stream with a
    DataError once `EXAMPLES_WITHOUT_A_ROW` examples in a row made none."""

    def __init__(self, describe: str):
        self.describe, self.since_row = describe, 0

    def examples(self, examples: Iterator[dict]) -> Iterator[dict]:
        for example in examples:
            self.since_row += 1
            if self.since_row > EXAMPLES_WITHOUT_A_ROW:
                raise DataError(f"{self.describe}: the feature converter made no row from {EXAMPLES_WITHOUT_A_ROW:,} "
                                "examples in a row, so no batch can be made; check that the data has what the "
                                "objective needs (Skip-Thought and Quick-Thought: paragraphs of at least two "
                                "consecutive sentences)")
            yield example

    def rows(self, rows: Iterator[dict]) -> Iterator[dict]:
        for row in rows:
            self.since_row = 0
            yield row


def derived_seed(*values: int) -> int:
    """A 31-bit seed mixing `values`, so nearby seeds (7 and 8, block k and k+1) draw unrelated streams."""
    return int(np.random.SeedSequence([int(v) for v in values]).generate_state(1)[0] >> 1)


def _allow_grain_flags() -> None:
    """grain's worker processes read its absl flags, which fails unless flags count as parsed
    (google/grain#1355); outside an absl app they are marked parsed, keeping their defaults."""
    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


class Subset:
    """Records `indices` of a random-access source, as a random-access source (picklable for grain's workers)."""

    def __init__(self, source, indices):
        self.source, self.indices = source, [int(i) for i in indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.source[self.indices[i]]


class GrainExamples:
    """A random-access task's examples, as blocks read through grain; position = (block, offset)."""

    def __init__(self, task: Task, split, sequence_length, seed, shuffle, repeat, data_dir, shard_index,
                 shard_count, block_size: int, worker_count: int, max_examples: int | None = None,
                 subset_seed: int = 0):
        if block_size < 1:
            raise ConfigError(f"Loader block_size must be positive, got {block_size}")
        self.task, self.sequence_length, self.seed, self.block_size = task, sequence_length, seed, block_size
        self.worker_count = worker_count
        self._describe = (task, split, shard_index, shard_count, data_dir)
        source = task.source.records(split, data_dir)
        if len(source) == 0:
            raise _empty_error(*self._describe)
        self.split_size = len(source)
        if max_examples is not None and max_examples < len(source):   # the same subset for every training seed
            source = Subset(source, np.random.default_rng(derived_seed(subset_seed, 2)).permutation(len(source))[:max_examples])
        records = grain.MapDataset.source(source)
        self.records_per_epoch = -(-len(records) // shard_count)  # of this shard, at most
        if shuffle:
            records = records.shuffle(seed=derived_seed(seed, 0))
        if repeat:
            records = records.repeat()
        self.blocks = records[shard_index::shard_count].batch(block_size, batch_fn=list).map_with_index(
            self._preprocess)
        self.block, self.offset = 0, 0
        self._sizes: collections.deque[int] = collections.deque()  # example counts of blocks read from `block` on

    def _preprocess(self, index: int, records: list) -> list:
        return list(self.task.preprocess(iter(records), self.sequence_length, derived_seed(self.seed, 1, index)))

    def examples(self) -> Iterator[dict]:
        # No reader threads: preprocessing holds the GIL, so parallelism comes from worker processes.
        blocks = self.blocks[self.block:].to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
        if self.worker_count:
            _allow_grain_flags()
            blocks = blocks.mp_prefetch(grain.MultiprocessingOptions(num_workers=self.worker_count))
        self._sizes.clear()
        skip, records_without_examples, any_example = self.offset, 0, False
        for examples in blocks:
            self._sizes.append(len(examples))
            any_example = any_example or bool(examples)
            records_without_examples = 0 if examples else records_without_examples + self.block_size
            if records_without_examples >= self.records_per_epoch + self.block_size:
                raise _empty_error(*self._describe)
            yield from examples[skip:]
            skip = 0
        if not any_example and self.block == 0:
            raise _empty_error(*self._describe)

    def advance(self, consumed: int) -> None:
        """Moves the position past `consumed` examples (all in blocks `examples()` has read)."""
        self.offset += consumed
        while self._sizes and self.offset >= self._sizes[0]:
            self.offset -= self._sizes.popleft()
            self.block += 1

    def state(self) -> dict:
        return {"block": self.block, "offset": self.offset, "block_size": self.block_size}

    def restore(self, state: Mapping) -> None:
        if "block" not in state:
            raise ConfigError(f"the checkpoint's data position {dict(state)} was written by the streaming loader "
                              "(examples consumed), but this task is now read through grain by blocks; resume "
                              "with the t5lite version that wrote it, or start a new MODEL_DIR")
        if state["block_size"] != self.block_size:
            raise ConfigError(f"the checkpoint's data position uses blocks of {state['block_size']} records, this "
                              f"loader {self.block_size}; the blocks decide the data, so set Loader block_size to "
                              f"{state['block_size']} to resume")
        self.block, self.offset = int(state["block"]), int(state["offset"])
        self._sizes.clear()


class StreamedExamples:
    """A Mixture's or a streaming source's examples, epoch after epoch; position = examples consumed."""

    def __init__(self, task: Task | Mixture, split, sequence_length, seed, shuffle, repeat, data_dir, shard_index,
                 shard_count):
        self._args = (task, split, sequence_length, seed, shuffle, shard_index, shard_count, data_dir, repeat)
        self.examples_consumed = 0

    def examples(self) -> Iterator[dict]:
        return itertools.islice(example_stream(*self._args), self.examples_consumed, None)

    def advance(self, consumed: int) -> None:
        self.examples_consumed += consumed

    def state(self) -> dict:
        return {"examples_consumed": self.examples_consumed}

    def restore(self, state: Mapping) -> None:
        if "examples_consumed" not in state:
            raise ConfigError(f"the checkpoint's data position {dict(state)} was written by the grain loader, but "
                              f"this task or mixture is streamed; resume with the same task and t5lite version")
        self.examples_consumed = int(state["examples_consumed"])


def example_stream(task: Task | Mixture, split: str, sequence_length, seed: int, shuffle: bool,
                   shard_index: int, shard_count: int, data_dir: str | None = None, repeat: bool = True):
    """Examples of every epoch in turn (a Mixture is already endless).

    An epoch without a single example (an empty shard, or preprocessors that drop every example)
    is an error: repeating it would loop forever without yielding."""
    if isinstance(task, Mixture):
        yield from task.get_dataset(split, sequence_length, shuffle, seed, data_dir, shard_index, shard_count)
        return
    for epoch in itertools.count() if repeat else [0]:
        empty = True
        for example in task.get_dataset(split, sequence_length, shuffle, seed + 100_003 * epoch, data_dir,
                                        shard_index, shard_count):
            empty = False
            yield example
        if empty:
            raise _empty_error(task, split, shard_index, shard_count, data_dir)


class Loader:
    """Yields this data shard's slice of each global batch as numpy arrays; `state()` is JSON for checkpoints.

    `shard_index`/`shard_count` say which data-parallel replica group this process feeds (default:
    one shard per process); `block_size` is how many records are preprocessed together;
    `worker_count` grain processes preprocess blocks (0: in this process); `max_examples` keeps that
    many records of the split (a random-access task's), drawn by `subset_seed` before the shuffle
    of `seed`, so every training seed reads the same subset."""

    def __init__(self, task: Task | Mixture, split: str, task_feature_lengths: Mapping[str, int],
                 global_batch_size: int, feature_converter: str = "enc_dec", pack: bool = True, seed: int = 0,
                 shuffle: bool = True, repeat: bool = True, data_dir: str | None = None,
                 shard_index: int | None = None, shard_count: int | None = None, block_size: int = 128,
                 worker_count: int = 0, max_examples: int | None = None, subset_seed: int = 0):
        self.shard_index = jax.process_index() if shard_index is None else shard_index
        self.shard_count = jax.process_count() if shard_count is None else shard_count
        if global_batch_size % self.shard_count:
            raise ConfigError(f"batch size {global_batch_size} does not divide over {self.shard_count} data shards "
                              f"(data-parallel replica groups); use a multiple of {self.shard_count}")
        self.task_feature_lengths = dict(task_feature_lengths)
        self.local_batch_size = global_batch_size // self.shard_count
        self.converter = converter_registry.get_feature_converter(feature_converter)
        self.pack, self.seed, self.repeat = pack, seed, repeat
        self.describe = f"task {task.name!r} split {split!r}"
        args = (task, split, self.task_feature_lengths, seed, shuffle, repeat, data_dir, self.shard_index,
                self.shard_count)
        if isinstance(task, Task) and hasattr(task.source, "records"):
            self.source = GrainExamples(*args, block_size=block_size, worker_count=worker_count,
                                        max_examples=max_examples, subset_seed=subset_seed)
        elif max_examples is not None:
            raise ConfigError(f"train.train_examples={max_examples} draws examples of one task's split; "
                              f"{task.name!r} is a mixture or a streamed source: train on one of its tasks")
        else:
            self.source = StreamedExamples(*args)

    def state(self) -> dict:
        return {**self.source.state(), "seed": self.seed, "shard_index": self.shard_index,
                "shard_count": self.shard_count}

    def restore(self, state: Mapping) -> None:
        count = state.get("shard_count", state.get("process_count", self.shard_count))
        if count != self.shard_count:
            raise ConfigError(f"the checkpoint's data position was written for {count} data shards (hosts or "
                              f"replica groups); resuming with {self.shard_count} would change the data order")
        self.source.restore(state)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        watch = _RowWatch(self.describe)
        rows = self.converter.convert(watch.examples(self.source.examples()), self.task_feature_lengths, pack=self.pack)
        for batch in self.converter.batch(watch.rows(rows), self.local_batch_size, drop_remainder=self.repeat):
            self.source.advance(int(batch.pop(EXAMPLES_KEY)))
            yield batch


def prefetch(loader: Loader, size: int = 2) -> Iterator[tuple[dict[str, np.ndarray], dict]]:
    """(batch, loader state after that batch) pairs, produced `size` ahead on a background thread.

    The state travels with its batch, so a checkpoint written after training on a batch records
    exactly the position after it, however far the producer has run ahead.
    """
    import queue
    import threading

    done = object()
    items: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()

    def produce():
        try:
            for batch in loader:
                while not stop.is_set():
                    try:
                        items.put((batch, loader.state()), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put(done)
        except BaseException as e:  # surfaced in the consumer, with its traceback
            items.put(e)

    thread = threading.Thread(target=produce, name="t5lite-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
