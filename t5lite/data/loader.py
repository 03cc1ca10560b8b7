"""Deterministic, resumable, per-host batches for training.

The example stream is a pure function of (seed, epoch): each host reads its own shard of every
epoch (shuffled with a per-epoch seed), examples are packed or padded into rows, and rows into
this host's slice of the global batch. Because greedy packing only depends on where a row
starts, the whole position is one number — how many examples the emitted batches consumed —
and resuming skips that many examples, giving exactly the batches an uninterrupted run sees.
"""
from __future__ import annotations

import itertools
from typing import Iterator, Mapping

import jax
import numpy as np

from t5lite.data import converters
from t5lite.data.registry import Mixture, Task
from t5lite.errors import ConfigError, DataError

EXAMPLES_KEY = converters.EXAMPLES_KEY


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
            raise DataError(f"task {task.name!r} split {split!r} yields no examples for shard {shard_index} of "
                            f"{shard_count} (data_dir={data_dir!r}): the split is empty, or its preprocessors drop "
                            "every example (e.g. all longer than the feature lengths); check the data and lengths")


class Loader:
    """Yields this host's slice of each global batch as numpy arrays; `state()` is JSON for checkpoints."""

    def __init__(self, task: Task | Mixture, split: str, task_feature_lengths: Mapping[str, int],
                 global_batch_size: int, feature_converter: str = "enc_dec", pack: bool = True, seed: int = 0,
                 shuffle: bool = True, repeat: bool = True, data_dir: str | None = None,
                 process_index: int | None = None, process_count: int | None = None):
        self.process_index = jax.process_index() if process_index is None else process_index
        self.process_count = jax.process_count() if process_count is None else process_count
        if global_batch_size % self.process_count:
            raise ConfigError(f"batch size {global_batch_size} does not divide over {self.process_count} hosts; "
                              f"use a multiple of {self.process_count}")
        self.task, self.split = task, split
        self.task_feature_lengths = dict(task_feature_lengths)
        self.local_batch_size = global_batch_size // self.process_count
        self.converter = converters.get_feature_converter(feature_converter)
        self.pack, self.seed, self.shuffle, self.repeat, self.data_dir = pack, seed, shuffle, repeat, data_dir
        self.examples_consumed = 0

    def state(self) -> dict:
        return {"examples_consumed": int(self.examples_consumed), "seed": self.seed,
                "process_index": self.process_index, "process_count": self.process_count}

    def restore(self, state: Mapping) -> None:
        if state.get("process_count", self.process_count) != self.process_count:
            raise ConfigError(f"the checkpoint's data position was written by {state['process_count']} hosts; "
                              f"resuming on {self.process_count} hosts would change the data order")
        self.examples_consumed = int(state["examples_consumed"])

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        examples = example_stream(self.task, self.split, self.task_feature_lengths, self.seed, self.shuffle,
                                  self.process_index, self.process_count, self.data_dir, self.repeat)
        examples = itertools.islice(examples, self.examples_consumed, None)
        rows = self.converter.convert(examples, self.task_feature_lengths, pack=self.pack)
        for batch in converters.batch(rows, self.local_batch_size, drop_remainder=self.repeat):
            self.examples_consumed += int(batch.pop(EXAMPLES_KEY))
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
