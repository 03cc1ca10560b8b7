"""The loader: a resumed loader continues with exactly the batches an uninterrupted one yields."""
import itertools

import numpy as np
import pytest

from t5lite.data import FunctionSource, Feature, TaskRegistry
from t5lite.data import preprocessors as P
from t5lite.data.loader import Loader, prefetch
from t5lite.errors import ConfigError, DataError


class CharVocab:
    """Bytes + 3 as ids (0 pad, 1 EOS); enough for packing tests without SentencePiece."""
    vocab_size = 300
    eos_id = 1

    def encode(self, text):
        return [b + 3 for b in text.encode()]

    def decode(self, ids):
        return bytes(i - 3 for i in ids if i > 2).decode()


@pytest.fixture(scope="module")
def task():
    name = "test_loader_copy_task"
    rng = np.random.default_rng(0)
    rows = [{"text": f"{i:02d}" + "".join(rng.choice(list("abcdefgh"), rng.integers(1, 12)))} for i in range(57)]
    TaskRegistry.remove(name)
    feature = Feature(CharVocab())
    yield TaskRegistry.add(name, FunctionSource(lambda split: rows, splits=("train",)),
                           [lambda ds: ({"inputs": r["text"], "targets": r["text"][::-1]} for r in ds),
                            P.tokenize, P.append_eos_after_trim], {"inputs": feature, "targets": feature})
    TaskRegistry.remove(name)


LENGTHS = {"inputs": 24, "targets": 24}


def _loader(task, **kwargs):
    return Loader(task, "train", LENGTHS, global_batch_size=4, pack=True, seed=7, **kwargs)


def _take(loader, n):
    return list(itertools.islice(iter(loader), n))


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def test_resume_continues_with_the_same_batches(task):
    straight = _take(_loader(task), 30)  # several epochs of 57 examples
    first = _loader(task)
    _take(first, 11)
    resumed = _loader(task)
    resumed.restore(first.state())
    _assert_same(_take(resumed, 19), straight[11:])


def test_epochs_are_reshuffled_and_deterministic(task):
    a, b = _take(_loader(task), 12), _take(_loader(task), 12)
    _assert_same(a, b)
    other_seed = _take(Loader(task, "train", LENGTHS, 4, pack=True, seed=8), 12)
    assert not all(np.array_equal(x["encoder_input_tokens"], y["encoder_input_tokens"]) for x, y in zip(a, other_seed))


def test_hosts_read_disjoint_halves(task):
    def texts(index):
        loader = Loader(task, "train", LENGTHS, 4, pack=False, seed=7, shuffle=False, repeat=False,
                        shard_index=index, shard_count=2)
        return [CharVocab().decode(row) for b in loader for row in b["encoder_input_tokens"]]
    host0, host1 = texts(0), texts(1)
    # Every other example of the 57: 29 for host 0, 28 for host 1 (no repeat: the short batch is kept).
    assert (len(host0), len(host1)) == (29, 28) and len(set(host0)) == 29
    assert set(host0).isdisjoint(host1)


def test_prefetch_yields_the_same_batches_and_states(task):
    plain = _loader(task)
    expected = [(b, plain.state()) for b in itertools.islice(iter(plain), 9)]
    got = list(itertools.islice(prefetch(_loader(task), size=3), 9))
    _assert_same([b for b, _ in got], [b for b, _ in expected])
    assert [s for _, s in got] == [s for _, s in expected]


def test_restoring_with_another_host_count_fails(task):
    loader = _loader(task, shard_index=0, shard_count=2)
    with pytest.raises(ValueError, match="written for 2 data shards"):
        _loader(task, shard_index=0, shard_count=1).restore(loader.state())


def _first_batch_or_error(make_loader, seconds=20):
    """Builds a loader and runs its first batch on a thread, so a loader that loops forever fails the
    test instead of hanging it."""
    import threading
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(_catch(lambda: next(iter(make_loader())))), daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"the loader yielded nothing and raised nothing within {seconds}s"
    return outcome[0]


def _catch(fn):
    try:
        return fn()
    except Exception as e:  # returned to the test thread
        return e


@pytest.mark.parametrize("rows, drop_all", [([], False), ([{"text": "abc"}] * 5, True)])
def test_an_epoch_without_examples_is_an_error_not_an_endless_loop(rows, drop_all):
    name = "test_loader_empty_task"
    feature = Feature(CharVocab())
    TaskRegistry.remove(name)
    drop = [lambda ds: (r for r in ds if False)] if drop_all else []
    empty = TaskRegistry.add(name, FunctionSource(lambda split: rows, splits=("train",)),
                             drop + [lambda ds: ({"inputs": r["text"], "targets": r["text"]} for r in ds),
                                     P.tokenize, P.append_eos_after_trim], {"inputs": feature, "targets": feature})
    try:
        error = _first_batch_or_error(lambda: _loader(empty))
    finally:
        TaskRegistry.remove(name)
    assert isinstance(error, DataError) and f"task {name!r} split 'train' yields no examples" in str(error)


def test_examples_that_make_no_row_are_an_error_not_an_endless_loop(monkeypatch):
    """Skip-Thought's converter on paragraphs without a sentence (a corpus of headings) makes no row
    from any example: the loader gives up instead of cycling through epochs for ever."""
    from t5lite.data import loader as loader_lib
    monkeypatch.setattr(loader_lib, "EXAMPLES_WITHOUT_A_ROW", 200)
    name = "test_loader_no_sentence_task"
    TaskRegistry.remove(name)
    headings = TaskRegistry.add(name, FunctionSource(lambda split: [{"text": " "}] * 7, splits=("train",)),
                                [lambda ds: ({"targets_pretokenized": r["text"]} for r in ds)], {})
    try:
        error = _first_batch_or_error(lambda: Loader(headings, "train", {"text0": 16}, 4,
                                                     feature_converter="consecutive_sentences", pack=False))
    finally:
        TaskRegistry.remove(name)
    assert isinstance(error, DataError), error
    assert f"task {name!r} split 'train'" in str(error) and "made no row from 200 examples" in str(error)


def test_a_batch_that_does_not_divide_over_hosts_says_what_to_use(task):
    with pytest.raises(ConfigError, match=r"batch size 6 does not divide over 4 data shards .*; use a multiple of 4"):
        Loader(task, "train", LENGTHS, 6, shard_index=0, shard_count=4)


class BillionRecords:
    """10^9 records computed from their index: nothing is stored, so only the loader can cost memory."""

    def __len__(self):
        return 10**9

    def __getitem__(self, index):
        return {"text": f"record {index} " + "abcdefgh"[index % 8] * (index % 13 + 1)}


@pytest.fixture(scope="module")
def huge_task():
    name = "test_loader_billion_records"
    TaskRegistry.remove(name)
    feature = Feature(CharVocab())
    yield TaskRegistry.add(name, FunctionSource(lambda split: BillionRecords(), splits=("train",)),
                           [lambda ds: ({"inputs": r["text"], "targets": r["text"]} for r in ds),
                            P.tokenize, P.append_eos_after_trim], {"inputs": feature, "targets": feature})
    TaskRegistry.remove(name)


def test_resuming_at_record_1e8_of_1e9_costs_under_a_second_and_100_mb(huge_task):
    import time
    import tracemalloc
    _take(_loader(huge_task), 1)  # imports and first-call costs out of the measurement
    position = {"block": 10**8 // 128, "offset": 5, "block_size": 128, "seed": 7, "shard_index": 0,
                "shard_count": 1}
    tracemalloc.start()
    start = time.perf_counter()
    resumed = _loader(huge_task)
    resumed.restore(position)
    batch = next(iter(resumed))
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert seconds < 1.0 and peak < 100 * 2**20, (seconds, peak / 2**20)
    # It starts at record 10^8 + 5 of the stream: that record of grain's own index-shuffled view of the source.
    import grain
    from t5lite.data.loader import derived_seed
    expected = grain.MapDataset.source(BillionRecords()).shuffle(seed=derived_seed(7, 0))[10**8 // 128 * 128 + 5]
    first_row = batch["encoder_input_tokens"][0][batch["encoder_segment_ids"][0] == 1]
    assert CharVocab().decode(first_row) == expected["text"][:23]


def test_resume_inside_a_block_continues_with_the_same_batches(task):
    loader = lambda: Loader(task, "train", LENGTHS, 4, pack=True, seed=3, block_size=5)  # noqa: E731
    straight = _take(loader(), 20)
    offsets = []
    for stop in (1, 2, 7):
        first = loader()
        _take(first, stop)
        offsets.append(first.state()["offset"])
        resumed = loader()
        resumed.restore(first.state())
        _assert_same(_take(resumed, 20 - stop), straight[stop:])
    assert any(offsets), offsets  # some positions fall inside a block


@pytest.mark.slow  # starts grain worker processes; test_resume_inside_a_block_continues... is the fast sibling
def test_worker_processes_yield_the_same_batches_and_resume_exactly(task):
    """grain's worker processes preprocess blocks round-robin; the batches must not depend on how many."""
    loader = lambda workers: Loader(task, "train", LENGTHS, 4, pack=True, seed=3, block_size=8,  # noqa: E731
                                    worker_count=workers)
    straight = _take(loader(0), 12)
    with_workers = loader(2)
    _assert_same(_take(with_workers, 5), straight[:5])
    resumed = loader(2)
    resumed.restore(with_workers.state())
    _assert_same(_take(resumed, 7), straight[5:])


def test_unshuffled_rows_are_the_packed_stream_of_the_task(task):
    """Without shuffling, grain's blocks of a per-example task give exactly the rows that packing the
    task's own example stream (epoch after epoch) gives: the block layout changes nothing there."""
    from t5lite.data import converter_registry, converters
    got = _take(Loader(task, "train", LENGTHS, 4, pack=True, shuffle=False, block_size=16), 12)
    stream = itertools.chain.from_iterable(task.get_dataset("train", LENGTHS) for _ in range(4))
    rows = converter_registry.get_feature_converter("enc_dec").convert(stream, LENGTHS, pack=True)
    expected = list(itertools.islice(converters.batch(rows, 4), 12))
    for b in expected:
        b.pop(converters.EXAMPLES_KEY)
    _assert_same(got, expected)


def test_a_tfds_task_is_read_through_grain_and_resumes_exactly():
    tfds = pytest.importorskip("tensorflow_datasets", reason="the TFDS path needs tensorflow-datasets")
    from t5lite.data import get_task
    from t5lite.data.loader import GrainExamples
    make = lambda: Loader(get_task("c4_span_corruption"), "train", {"inputs": 32, "targets": 8}, 4, seed=1,  # noqa: E731
                          block_size=16)
    with tfds.testing.mock_data(num_examples=60, policy=tfds.testing.MockPolicy.USE_CODE):
        assert isinstance(make().source, GrainExamples)
        straight = _take(make(), 10)
        first = make()
        _take(first, 4)
        resumed = make()
        resumed.restore(first.state())
        _assert_same(_take(resumed, 6), straight[4:])


def test_a_position_of_the_streaming_loader_is_refused_with_the_reason(task):
    """Checkpoints written before the grain loader hold `examples_consumed`; a grain-read task cannot
    continue from it without replaying the stream, so it says so instead of restarting the data."""
    with pytest.raises(ConfigError, match="written by the streaming loader"):
        _loader(task).restore({"examples_consumed": 10, "seed": 7, "process_index": 0, "process_count": 1})


def _prefixes(loader, count):
    """The row numbers (each text's first two characters) of the next `count` examples."""
    examples = itertools.islice(loader.source.examples(), count)
    return [CharVocab().decode(e["inputs"][:2]) for e in examples]


def test_max_examples_keeps_one_subset_for_every_training_seed_and_each_epoch_reads_it_all(task):
    seen = _prefixes(_loader(task, max_examples=10), 30)   # three epochs of 10
    assert len(set(seen)) == 10 and all(sorted(seen[i:i + 10]) == sorted(set(seen)) for i in (0, 10, 20))
    assert seen[:10] != seen[10:20]   # reshuffled each epoch
    other_seed = Loader(task, "train", LENGTHS, 4, pack=True, seed=8, max_examples=10)
    assert set(_prefixes(other_seed, 10)) == set(seen)
    assert set(_prefixes(_loader(task, max_examples=10, subset_seed=1), 10)) != set(seen)
    assert len(set(_prefixes(_loader(task, max_examples=57), 57))) == 57 == _loader(task, max_examples=500).source.split_size
    straight = _take(_loader(task, max_examples=10), 12)
    first = _loader(task, max_examples=10)
    _take(first, 5)
    resumed = _loader(task, max_examples=10)
    resumed.restore(first.state())
    _assert_same(_take(resumed, 7), straight[5:])


def test_max_examples_of_a_streamed_source_is_refused():
    class Streamed:
        splits = ("train",)

        def load(self, split, **kwargs):
            return iter([{"text": "ab"}])
    name = "test_loader_streamed"
    TaskRegistry.remove(name)
    streamed = TaskRegistry.add(name, Streamed(), [], {})
    try:
        with pytest.raises(ConfigError, match="train.train_examples=5 draws examples of one task's split; "
                                              "'test_loader_streamed' is a mixture or a streamed source"):
            Loader(streamed, "train", LENGTHS, 4, max_examples=5)
    finally:
        TaskRegistry.remove(name)
