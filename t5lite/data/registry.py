"""Tasks and mixtures: a dataset is a value you can print, get by name, and iterate.

A Task is a source of raw examples, a list of preprocessors, the output features with their
vocabularies, and the metrics. Preprocessors are functions over iterators of example dicts
(`fn(dataset, **kwargs) -> iterator`), as seqio's are over tf.data; a preprocessor receives
`sequence_length`, `output_features` and `seed` only if its signature names them.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import itertools
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from t5lite import writable
from t5lite.errors import ConfigError, DataError

Example = dict[str, Any]
Preprocessor = Callable[..., Iterable[Example]]
MetricFn = Callable[[Sequence[Any], Sequence[Any]], Mapping[str, float]]


@dataclasses.dataclass(frozen=True)
class Feature:
    """One output feature (`inputs` or `targets`): its vocabulary and whether EOS is appended."""
    vocabulary: Any
    add_eos: bool = True
    required: bool = True


class Source(Protocol):
    """Raw examples of a split. Shuffling and per-host sharding happen here, before preprocessing.

    A source that can also hand out the split in random-access form has `records(split, data_dir)`
    returning a `RandomAccess`; the training loader then reads it through grain (index shuffle,
    O(1) resume). Sources without it are streamed."""
    splits: Sequence[str]

    def load(self, split: str, *, data_dir: str | None = None, shuffle: bool = False, seed: int = 0,
             shard_index: int = 0, shard_count: int = 1) -> Iterator[Example]: ...


class RandomAccess(Protocol):
    """A split's raw examples by index: a list, TFDS's `data_source`, ArrayRecord shards, ..."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Example: ...


def is_random_access(records: Any) -> bool:
    return hasattr(records, "__len__") and hasattr(records, "__getitem__") and not isinstance(records, Mapping)


def shuffle_and_shard(examples: Sequence[Example], *, shuffle: bool, seed: int, shard_index: int,
                      shard_count: int) -> Iterator[Example]:
    """A seeded permutation of a random-access split, then every `shard_count`-th example."""
    order = np.arange(len(examples))
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(examples))
    for i in order[shard_index::shard_count]:
        yield examples[int(i)]


@dataclasses.dataclass
class FunctionSource:
    """Examples from a Python function `fn(split)` returning a list, any `RandomAccess` object (kept
    as it is, so a source of 10^9 records computed on the fly is never materialised) or an iterable
    (read into a list). Called once per `load` / `records`."""
    fn: Callable[[str], Iterable[Example] | RandomAccess]
    splits: Sequence[str] = ("train", "validation")

    def records(self, split: str, data_dir: str | None = None) -> RandomAccess:
        _check_split(self, split)
        records = self.fn(split)
        return records if is_random_access(records) else list(records)

    def load(self, split, *, data_dir=None, shuffle=False, seed=0, shard_index=0, shard_count=1):
        return shuffle_and_shard(self.records(split), shuffle=shuffle, seed=seed,
                                 shard_index=shard_index, shard_count=shard_count)


def _check_split(source, split: str) -> None:
    if split not in source.splits:
        raise ConfigError(f"unknown split {split!r}; this source has {list(source.splits)}")


def call_preprocessor(fn: Preprocessor, dataset: Iterable[Example], **available) -> Iterable[Example]:
    """Calls `fn(dataset, ...)` passing only the keyword arguments its signature names."""
    params = inspect.signature(fn).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in available.items() if takes_all or k in params}
    return fn(dataset, **kwargs)


def map_over_dataset(fn: Callable[..., Example | None]) -> Preprocessor:
    """Turns a per-example function into a preprocessor; returning None drops the example."""
    params = inspect.signature(fn).parameters

    def preprocessor(dataset, **kwargs):
        for ex in dataset:
            out = fn(ex, **{k: v for k, v in kwargs.items() if k in params})
            if out is not None:
                yield out

    preprocessor.__signature__ = inspect.Signature(
        [inspect.Parameter("dataset", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [p for name, p in params.items() if name in ("sequence_length", "output_features", "seed")])
    preprocessor.__name__ = getattr(fn, "__name__", "preprocessor")
    preprocessor.__doc__ = fn.__doc__
    return preprocessor


@dataclasses.dataclass
class Task:
    name: str
    source: Source
    preprocessors: Sequence[Preprocessor]
    output_features: Mapping[str, Feature]
    metric_fns: Sequence[MetricFn] = ()
    postprocess_fn: Callable[..., Any] | None = None

    def __repr__(self):
        steps = ", ".join(getattr(getattr(p, "func", p), "__name__", repr(p)) for p in self.preprocessors)
        return (f"Task({self.name!r}, source={type(self.source).__name__}, splits={list(self.source.splits)}, "
                f"preprocessors=[{steps}], features={list(self.output_features)})")

    @property
    def splits(self) -> Sequence[str]:
        return self.source.splits

    def get_dataset(self, split: str, sequence_length: Mapping[str, int] | None = None, shuffle: bool = False,
                    seed: int = 0, data_dir: str | None = None, shard_index: int = 0,
                    shard_count: int = 1) -> Iterator[Example]:
        """Preprocessed examples of `split`: a deterministic function of the arguments."""
        dataset = self.source.load(split, data_dir=data_dir, shuffle=shuffle, seed=seed,
                                   shard_index=shard_index, shard_count=shard_count)
        return self.preprocess(dataset, sequence_length, seed)

    def preprocess(self, examples: Iterable[Example], sequence_length: Mapping[str, int] | None = None,
                   seed: int = 0) -> Iterator[Example]:
        """Raw examples through the preprocessors; preprocessor i draws its randomness from seed * 1000 + i."""
        for i, fn in enumerate(self.preprocessors):
            examples = call_preprocessor(fn, examples, sequence_length=sequence_length,
                                         output_features=self.output_features, seed=seed * 1000 + i)
        return iter(examples)

    def postprocess(self, text: str, example: Example | None = None, is_target: bool = False):
        if self.postprocess_fn is None:
            return text
        return call_preprocessor(self.postprocess_fn, text, example=example, is_target=is_target)


@dataclasses.dataclass
class Mixture:
    """Several tasks sampled by rate: a number, or a function `rate(task, split, data_dir)` such as
    `ExamplesProportional(maximum=K, temperature=T)`, T5's examples-proportional mixing. `alpha`
    smooths the rates' shares as XLM smooths its languages' (`smoothed_rates`; 1: the shares as they are)."""
    name: str
    tasks_and_rates: Sequence[tuple[str, float | Callable[..., float]]]
    alpha: float = 1.0

    def __repr__(self):
        alpha = "" if self.alpha == 1.0 else f", alpha={self.alpha}"
        return f"Mixture({self.name!r}, {list(self.tasks_and_rates)}{alpha})"

    @property
    def tasks(self) -> list[Task]:
        return [TaskRegistry.get(name) for name, _ in self.tasks_and_rates]

    @property
    def output_features(self):
        return self.tasks[0].output_features

    @property
    def splits(self):
        return self.tasks[0].splits

    def get_dataset(self, split, sequence_length=None, shuffle=False, seed=0, data_dir=None, shard_index=0,
                    shard_count=1) -> Iterator[Example]:
        """Interleaves the tasks' examples, choosing a task per example with the given rates."""
        probs = self.probabilities(split, data_dir)
        iterators = [_repeat(t, split, sequence_length, shuffle, seed + k, data_dir, shard_index, shard_count)
                     for k, t in enumerate(self.tasks)]
        rng = np.random.default_rng(seed)
        while True:
            yield next(iterators[rng.choice(len(iterators), p=probs)])

    def probabilities(self, split: str, data_dir: str | None = None) -> np.ndarray:
        """The chance of drawing each task's example next: its rate's share, smoothed by `alpha`."""
        rates = self.rates(split, data_dir)
        if sum(rates) <= 0:
            raise ValueError(f"mixture {self.name!r}: rates must sum to a positive number, got {rates}")
        return smoothed_rates(rates, self.alpha)

    def rates(self, split: str, data_dir: str | None = None) -> list[float]:
        """Each task's rate for `split` (rate functions are evaluated on that split)."""
        return [float(rate(task, split, data_dir) if callable(rate) else rate)
                for task, (_, rate) in zip(self.tasks, self.tasks_and_rates)]


def _repeat(task, split, sequence_length, shuffle, seed, data_dir, shard_index, shard_count):
    """A task's examples epoch after epoch; an epoch with none is an error, not an endless loop."""
    for epoch in itertools.count():
        empty = True
        for example in task.get_dataset(split, sequence_length, shuffle, seed * 7919 + epoch, data_dir,
                                        shard_index, shard_count):
            empty = False
            yield example
        if empty:
            raise DataError(f"task {task.name!r} of a mixture yields no {split!r} examples (shard {shard_index} of "
                            f"{shard_count}, data_dir={data_dir!r}); check its files or drop it from the mixture")


def rate_num_examples(num_examples: int, maximum: int | None = None, temperature: float = 1.0) -> float:
    """T5's examples-proportional rate: min(n, K) ** (1 / temperature)."""
    n = num_examples if maximum is None else min(num_examples, maximum)
    return float(n) ** (1.0 / temperature)


def smoothed_rates(sizes: Sequence[float], alpha: float) -> np.ndarray:
    """XLM's language sampling (Conneau & Lample 2019): q_i = p_i^alpha / sum_j p_j^alpha with p_i
    = n_i / sum_j n_j, each language's share of the sentences. alpha < 1 draws the small languages
    more often than their share (XLM: 0.5, XLM-R: 0.3); 1 keeps the shares. Equal to
    `ExamplesProportional(temperature=1 / alpha)` normalised."""
    if not alpha > 0:
        raise ConfigError(f"mixture alpha={alpha}: the smoothing exponent must be positive (XLM uses 0.5, XLM-R 0.3)")
    shares = np.asarray(sizes, np.float64) / np.sum(sizes)
    smoothed = shares ** alpha
    return smoothed / smoothed.sum()


def num_examples(task: Task, split: str, data_dir: str | None = None) -> int:
    """Raw examples in a split (before preprocessing): the source's own count if it has one, else by reading."""
    count = getattr(task.source, "num_examples", None)
    if count is not None:
        return int(count(split, data_dir=data_dir))
    return sum(1 for _ in task.source.load(split, data_dir=data_dir))


@dataclasses.dataclass(frozen=True)
class ExamplesProportional:
    """A mixture rate: `rate_num_examples` of the task's size in the split being mixed."""
    maximum: int | None = None
    temperature: float = 1.0

    def __call__(self, task: Task, split: str, data_dir: str | None = None) -> float:
        return rate_num_examples(num_examples(task, split, data_dir), self.maximum, self.temperature)


class _Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, Any] = {}

    def _add(self, name: str, item):
        writable.check_name(name, f"{self.kind} name")   # output folders are named after it
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered; pick another name or remove it first")
        self._items[name] = item
        return item

    def get(self, name: str):
        if name not in self._items:
            close = difflib.get_close_matches(name, self._items, n=5, cutoff=0.5)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise KeyError(f"unknown {self.kind} {name!r}.{hint} `t5lite tasks list` shows all names.")
        return self._items[name]

    def remove(self, name: str) -> None:
        self._items.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._items)


class _TaskRegistry(_Registry):
    def add(self, name: str, source: Source, preprocessors: Sequence[Preprocessor],
            output_features: Mapping[str, Feature], metric_fns: Sequence[MetricFn] = (),
            postprocess_fn=None) -> Task:
        return self._add(name, Task(name, source, list(preprocessors), dict(output_features), list(metric_fns),
                                    postprocess_fn))


class _MixtureRegistry(_Registry):
    def add(self, name: str, tasks_and_rates: Sequence[tuple[str, float | Callable[..., float]]],
            alpha: float = 1.0) -> Mixture:
        for task_name, _ in tasks_and_rates:
            TaskRegistry.get(task_name)
        smoothed_rates([1.0], alpha)   # refuses a bad alpha now, not at the first draw
        return self._add(name, Mixture(name, list(tasks_and_rates), alpha))


TaskRegistry = _TaskRegistry("task")
MixtureRegistry = _MixtureRegistry("mixture")

