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


def test_glue_proportional_on_real_files():
    mixture = get_mixture("glue_proportional")
    assert "glue_ax" not in [t.name for t in mixture.tasks] and "glue_sst2" in [t.name for t in mixture.tasks]
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
        assert get_mixture("glue_proportional").rates("train")[:2] == [7.0, 7.0]


def test_issue_task_names_are_registered():
    names = ["glue_cola", "glue_sst2", "glue_mrpc", "glue_qqp", "glue_stsb", "glue_mnli", "glue_qnli", "glue_rte",
             "glue_wnli", "glue_ax", "squad_v1", "squad_v2", "wmt14_ende", "wmt14_enfr", "wmt16_enro", "cnn_dailymail",
             "xsum", "c4_span_corruption"] + [f"super_glue_{n}" for n in
                                              ("boolq", "cb", "copa", "multirc", "record", "rte", "wic", "wsc")]
    assert all(get_task(n).name == n for n in names)
