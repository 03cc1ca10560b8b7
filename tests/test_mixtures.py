"""Mixtures: T5's examples-proportional rates (size limit K, temperature) checked statistically,
determinism, and a mixture of real GLUE tasks read from ../shared/data/glue."""
import collections
import itertools

import numpy as np
import pytest
from conftest import shared_data_dir

from t5lite.data import FunctionSource, MixtureRegistry, TaskRegistry, get_mixture, get_task
from t5lite.data.registry import ExamplesProportional, num_examples, rate_num_examples

SHARED = shared_data_dir()  # <repo>/../shared/data or $T5LITE_SHARED_DATA
GLUE = str(SHARED / "glue")
SIZES = {"mix_small": 100, "mix_medium": 1000, "mix_large": 10000}


@pytest.fixture(scope="module")
def sized_tasks():
    """Three raw tasks (no preprocessing) whose examples say where they come from."""
    for name, size in SIZES.items():
        TaskRegistry.add(name, FunctionSource(lambda split, n=size, name=name: [{"task": name, "i": i}
                                                                               for i in range(n)]), [], {})
    yield list(SIZES)
    for name in SIZES:
        TaskRegistry.remove(name)


def _mixture(name, rate):
    MixtureRegistry.remove(name)
    return MixtureRegistry.add(name, [(t, rate) for t in SIZES])


def test_rate_num_examples():
    assert rate_num_examples(100) == 100
    assert rate_num_examples(10000, maximum=2000) == 2000
    assert rate_num_examples(10000, maximum=2000, temperature=2.0) == pytest.approx(2000 ** 0.5)


@pytest.mark.parametrize("maximum, temperature", [(None, 1.0), (2000, 1.0), (2000, 2.0), (None, 3.0)])
def test_examples_proportional_frequencies(sized_tasks, maximum, temperature):
    mixture = _mixture("mix_test", ExamplesProportional(maximum, temperature))
    expected = np.array([min(n, maximum or n) ** (1 / temperature) for n in SIZES.values()])
    expected /= expected.sum()
    assert mixture.rates("train") == pytest.approx(list(expected * sum(mixture.rates("train"))))
    draws = 20_000
    counts = collections.Counter(ex["task"] for ex in itertools.islice(mixture.get_dataset("train", seed=1), draws))
    observed = np.array([counts[t] for t in SIZES]) / draws
    sigma = np.sqrt(expected * (1 - expected) / draws)
    assert np.all(np.abs(observed - expected) < 5 * sigma), (observed, expected)


def test_mixture_is_deterministic_and_cycles_small_tasks(sized_tasks):
    mixture = _mixture("mix_det", ExamplesProportional(maximum=500))
    first = [(e["task"], e["i"]) for e in itertools.islice(mixture.get_dataset("train", shuffle=True, seed=4), 3000)]
    again = [(e["task"], e["i"]) for e in itertools.islice(mixture.get_dataset("train", shuffle=True, seed=4), 3000)]
    other = [(e["task"], e["i"]) for e in itertools.islice(mixture.get_dataset("train", shuffle=True, seed=5), 3000)]
    assert first == again and first != other
    small = [i for t, i in first if t == "mix_small"]
    assert len(small) > 100 and set(small) == set(range(100))  # repeated past one epoch


def test_registry_errors(sized_tasks):
    _mixture("mix_dup", 1.0)
    with pytest.raises(ValueError, match="already registered"):
        MixtureRegistry.add("mix_dup", [("mix_small", 1.0)])
    with pytest.raises(KeyError, match="Did you mean: mix_dup"):
        get_mixture("mix_dpu")
    with pytest.raises(KeyError, match="unknown task 'mix_smal'"):
        MixtureRegistry.add("mix_bad", [("mix_smal", 1.0)])


# T5's rates as REFERENCE.md lists them (t5.data.glue_utils; checked against t5 itself in test_reference_data.py).
GLUE_V002 = {"glue_cola": 8551, "glue_sst2": 67349, "glue_mrpc": 3668, "glue_qqp": 363849, "glue_stsb": 5749,
             "glue_mnli": 392702, "glue_qnli": 104743, "glue_rte": 2490, "glue_mnli_matched": 0,
             "glue_mnli_mismatched": 0, "glue_ax": 0}
SUPER_GLUE_V102 = {"dpr_v001_simple": 1322, "super_glue_wsc_train": 259, "super_glue_wsc": 0, "super_glue_boolq": 9427,
                   "super_glue_cb": 250, "super_glue_copa": 400, "super_glue_multirc": 27243,
                   "super_glue_record": 138854, "super_glue_rte": 2490, "super_glue_wic": 5428, "super_glue_axb": 0,
                   "super_glue_axg": 0}


@pytest.mark.parametrize("names, expected", [(("glue_v002_proportional", "glue_proportional"), GLUE_V002),
                                             (("super_glue_v102_proportional", "super_glue_proportional"),
                                              SUPER_GLUE_V102)])
def test_t5_mixture_rates(names, expected):
    for name in names:  # the T5 name and the earlier t5lite alias
        mixture = get_mixture(name)
        assert dict(zip((t.name for t in mixture.tasks), mixture.rates("train"))) == expected
    assert "glue_wnli" not in [t.name for t in get_mixture("glue_v002_proportional").tasks]


def test_rate_zero_tasks_are_never_sampled(sized_tasks):
    """T5's eval-only members (MNLI's dev sets, AX) have rate 0 and may lack the split being mixed."""
    TaskRegistry.remove("mix_eval_only")
    TaskRegistry.add("mix_eval_only", FunctionSource(lambda split: [{"task": "mix_eval_only"}], ("validation",)), [], {})
    try:
        MixtureRegistry.remove("mix_zero")
        mixture = MixtureRegistry.add("mix_zero", [("mix_small", 1.0), ("mix_medium", 0.0), ("mix_eval_only", 0.0)])
        drawn = {ex["task"] for ex in itertools.islice(mixture.get_dataset("train", seed=2), 500)}
        assert drawn == {"mix_small"}
    finally:
        TaskRegistry.remove("mix_eval_only")


def test_glue_proportional_on_real_files():
    assert num_examples(get_task("glue_rte"), "train", GLUE) == 2490
    assert num_examples(get_task("glue_wnli"), "train", GLUE) == 635
    MixtureRegistry.remove("rte_wnli")
    pair = MixtureRegistry.add("rte_wnli", [("glue_rte", ExamplesProportional(maximum=1000, temperature=2.0)),
                                            ("glue_wnli", ExamplesProportional(maximum=1000, temperature=2.0))])
    assert "ExamplesProportional(maximum=1000, temperature=2.0)" in repr(pair)
    assert pair.rates("train", GLUE) == pytest.approx([1000 ** 0.5, 635 ** 0.5])
    examples = list(itertools.islice(pair.get_dataset("train", data_dir=GLUE, sequence_length={"inputs": 32}), 200))
    prefixes = collections.Counter(e["inputs_pretokenized"].split()[0] for e in examples)
    assert set(prefixes) == {"rte", "wnli"}  # the proportions are checked statistically above
    assert all(e["inputs"].dtype == np.int32 and len(e["inputs"]) <= 32 for e in examples)


def test_tfds_sizes_come_from_the_data_source():
    tfds = pytest.importorskip("tensorflow_datasets", reason="the TFDS path needs tensorflow-datasets")
    with tfds.testing.mock_data(num_examples=7, policy=tfds.testing.MockPolicy.USE_CODE):
        assert num_examples(get_task("glue_cola"), "train") == 7
        MixtureRegistry.remove("glue_by_size")
        by_size = MixtureRegistry.add("glue_by_size", [("glue_cola", ExamplesProportional()),
                                                       ("glue_sst2", ExamplesProportional())])
        assert by_size.rates("train") == [7.0, 7.0]


def test_issue_task_names_are_registered():
    names = ["glue_cola", "glue_sst2", "glue_mrpc", "glue_qqp", "glue_stsb", "glue_mnli", "glue_qnli", "glue_rte",
             "glue_wnli", "glue_ax", "squad_v1", "squad_v2", "wmt14_ende", "wmt14_enfr", "wmt16_enro", "cnn_dailymail",
             "xsum", "c4_span_corruption"] + [f"super_glue_{n}" for n in
                                              ("boolq", "cb", "copa", "multirc", "record", "rte", "wic", "wsc")]
    assert all(get_task(n).name == n for n in names)


def test_a_member_with_no_examples_is_an_error_not_an_endless_loop(sized_tasks):
    import threading

    from t5lite.errors import DataError
    TaskRegistry.remove("mix_empty")
    TaskRegistry.add("mix_empty", FunctionSource(lambda split: []), [], {})
    outcome = {}

    def draw():
        try:
            list(itertools.islice(mixture.get_dataset("train", seed=0), 200))
        except DataError as e:
            outcome["error"] = str(e)

    try:
        MixtureRegistry.remove("mix_with_empty")
        mixture = MixtureRegistry.add("mix_with_empty", [("mix_small", 1.0), ("mix_empty", 1.0)])
        worker = threading.Thread(target=draw, daemon=True)
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive(), "drawing from a mixture with an empty member never returned"
        assert "mix_empty" in outcome["error"] and "'train'" in outcome["error"]
    finally:
        TaskRegistry.remove("mix_empty")


def test_a_mixture_is_evaluated_task_by_task_and_a_split_none_has_is_refused(sized_tasks):
    """A mixture samples its tasks without end, so evaluation builds each task's evaluators (under
    the task's name) from that task alone; a split none of its tasks has is refused, naming it."""
    from t5lite.errors import DataError
    from t5lite.infer.evaluation import per_task
    mixture = _mixture("mix_evaluated", 1.0)
    made = per_task(lambda task, split, lengths: {task.name: (task, split)}, mixture, "validation", {})
    assert made == {name: (get_task(name), "validation") for name in SIZES}
    with pytest.raises(DataError, match="mixture 'mix_evaluated': none of its tasks has a 'test' split"):
        per_task(lambda task, split, lengths: {task.name: task}, mixture, "test", {})
    MixtureRegistry.remove("mix_evaluated")
