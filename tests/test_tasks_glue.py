"""GLUE tasks on the real GLUE files in ../shared/data/glue (expected strings checked by reading the
files), plus the TFDS path under tfds.testing.mock_data."""
import collections
import itertools

import numpy as np
import pytest
from conftest import shared_data_dir

from t5lite import metrics
from t5lite.data import get_task
from t5lite.data.sources import MalformedRowError
from t5lite.data.tasks.glue import GLUE_TASKS, stsb_score_text

SHARED = shared_data_dir()  # <repo>/../shared/data or $T5LITE_SHARED_DATA
GLUE = str(SHARED / "glue")


def _first(task, split, n=1, **kwargs):
    return list(itertools.islice(get_task(task).get_dataset(split, data_dir=GLUE, **kwargs), n))


def _texts(ex):
    return ex["inputs_pretokenized"], ex["targets_pretokenized"]


@pytest.mark.parametrize("task, split, index, inputs, targets", [
    ("glue_sst2", "validation", 0, "sst2 sentence: it 's a charming and often affecting journey . ", "positive"),
    ("glue_sst2", "train", 0, "sst2 sentence: hide new secretions from the parental units ", "negative"),
    ("glue_cola", "validation", 0, "cola sentence: The sailors rode the breeze clear of the rocks.", "acceptable"),
    ("glue_mrpc", "validation", 0,
     "mrpc sentence1: He said the foodservice pie business doesn 't fit the company 's long-term growth strategy . "
     "sentence2: \" The foodservice pie business does not fit our long-term growth strategy .", "equivalent"),
    ("glue_mrpc", "train", 1,
     "mrpc sentence1: Yucaipa owned Dominick 's before selling the chain to Safeway in 1998 for $ 2.5 billion . "
     "sentence2: Yucaipa bought Dominick 's in 1995 for $ 693 million and sold it to Safeway for $ 1.8 billion in "
     "1998 .", "not_equivalent"),
    ("glue_stsb", "validation", 1,
     "stsb sentence1: A young child is riding a horse. sentence2: A child is riding a horse.", "4.8"),
    ("glue_stsb", "validation", 50,  # score 0.500: 2.5 rounds half to even -> 2 -> "0.4"
     "stsb sentence1: Two little girls are talking on the phone. sentence2: A little girl is walking down the "
     "street.", "0.4"),
    ("glue_qnli", "validation", 0,
     "qnli question: What came into force after the new constitution was herald? sentence: As of that day, the new "
     "constitution heralding the Second Republic came into force.", "entailment"),
    ("glue_rte", "train", 0,
     "rte sentence1: No Weapons of Mass Destruction Found in Iraq Yet. sentence2: Weapons of Mass Destruction Found "
     "in Iraq.", "not_entailment"),
    ("glue_wnli", "validation", 1,
     "wnli sentence1: Jane knocked on Susan's door but she did not answer. sentence2: Susan did not answer.",
     "entailment"),
    ("glue_ax", "test", 0,
     "mnli hypothesis: The cat did not sit on the mat. premise: The cat sat on the mat.", "<unk>"),
])
def test_real_rows_in_t5_format(task, split, index, inputs, targets):
    ex = _first(task, split, index + 1)[index]
    assert _texts(ex) == (inputs, targets)
    assert ex["idx"] == index
    vocab = get_task(task).output_features["inputs"].vocabulary
    assert ex["inputs"].dtype == np.int32 and ex["targets"].dtype == np.int32
    assert ex["inputs"].tolist() == vocab.encode(inputs) + [1]  # EOS appended
    assert ex["targets"].tolist() == vocab.encode(targets) + [1]


@pytest.mark.parametrize("task, split, counts", [  # the label counts SOURCES.md checked against GLUE's statistics
    ("glue_sst2", "validation", {"negative": 428, "positive": 444}),
    ("glue_cola", "validation", {"acceptable": 721, "unacceptable": 322}),
    ("glue_cola", "train", {"acceptable": 6023, "unacceptable": 2528}),
    ("glue_mrpc", "train", {"equivalent": 2474, "not_equivalent": 1194}),
    ("glue_rte", "validation", {"entailment": 146, "not_entailment": 131}),
    ("glue_wnli", "validation", {"not_entailment": 40, "entailment": 31}),
    ("glue_qnli", "validation", {"entailment": 2702, "not_entailment": 2761}),
])
def test_label_mapping_over_whole_files(task, split, counts):
    # Formatting only (no tokenizing), so whole files stay fast.
    t = get_task(task)
    raw = t.source.load(split, data_dir=GLUE)
    got = collections.Counter(ex["targets"] for ex in t.preprocessors[0](raw))
    assert got == counts


def test_stsb_rounding():
    assert [stsb_score_text(s) for s in (5.0, 4.75, 3.8, 0.5, 3.5, 1.5, 2.5, 0.0, -1)] == \
        ["5.0", "4.8", "3.8", "0.4", "3.6", "1.6", "2.4", "0.0", "-1.0"]


def test_split_mapping_and_splits():
    assert get_task("glue_sst2").splits == ("train", "validation", "test")
    assert get_task("glue_mnli").splits == ("train", "validation_matched", "validation_mismatched", "test_matched",
                                            "test_mismatched")
    assert get_task("glue_ax").splits == ("test",)
    files = get_task("glue_sst2").source.files
    assert files.files("validation", GLUE) == [f"{GLUE}/SST-2/dev.tsv"]
    assert files.files("test", GLUE) == []  # not in shared/data: such a split would go to TFDS
    mnli = get_task("glue_mnli").source.files.split_files
    assert mnli["validation_matched"] == "MNLI/dev_matched.tsv"
    assert mnli["validation_mismatched"] == "MNLI/dev_mismatched.tsv"


def test_headerless_cola_reads_every_row():
    # CoLA has no header and dev.tsv no final newline: 1043 and 8551 rows.
    assert sum(1 for _ in get_task("glue_cola").source.load("validation", data_dir=GLUE)) == 1043
    assert sum(1 for _ in get_task("glue_cola").source.load("train", data_dir=GLUE)) == 8551


def test_postprocess_and_metrics():
    sst2, stsb, mrpc, cola = (get_task(f"glue_{n}") for n in ("sst2", "stsb", "mrpc", "cola"))
    assert [sst2.postprocess(t) for t in ("negative", "positive", "neutral")] == [0, 1, -1]
    assert sst2.postprocess("positive", is_target=True) == 1
    assert [stsb.postprocess(t) for t in ("3.8", "five")] == [3.8, -1.0]
    assert list(sst2.metric_fns) == [metrics.accuracy]
    assert list(mrpc.metric_fns) == [metrics.f1_score_with_invalid, metrics.accuracy]
    assert list(cola.metric_fns) == [metrics.matthews_corrcoef]
    assert list(stsb.metric_fns) == [metrics.pearson_corrcoef, metrics.spearman_corrcoef]
    targets = [sst2.postprocess(t, is_target=True) for t in ("positive", "negative", "positive")]
    preds = [sst2.postprocess(p) for p in ("positive", "oops", "positive")]
    assert metrics.compute_metrics(sst2.metric_fns, targets, preds) == {"accuracy": pytest.approx(200 / 3)}


def test_sequence_length_trims_and_keeps_eos():
    ex = _first("glue_mrpc", "validation", sequence_length={"inputs": 8, "targets": 2})[0]
    assert len(ex["inputs"]) == 8 and ex["inputs"][-1] == 1
    assert len(ex["targets"]) == 2 and ex["targets"][-1] == 1


def test_malformed_glue_tsv(tmp_path, monkeypatch):
    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "dev.tsv").write_text("sentence\tlabel\ngood .\t1\nno label here\nbad .\t7\nfine .\t0\n")
    with pytest.raises(MalformedRowError, match=r"SST-2/dev\.tsv:3: expected 2 fields"):
        list(get_task("glue_sst2").get_dataset("validation", data_dir=str(tmp_path)))
    monkeypatch.setattr(get_task("glue_sst2").source.files, "on_malformed", "skip")
    got = [_texts(ex) for ex in get_task("glue_sst2").get_dataset("validation", data_dir=str(tmp_path))]
    assert got == [("sst2 sentence: good .", "positive"), ("sst2 sentence: fine .", "negative")]


def test_task_prints_and_lists_splits():
    text = repr(get_task("glue_mnli"))
    assert "glue_mnli" in text and "validation_mismatched" in text and "glue, tokenize" in text
    with pytest.raises(KeyError, match="glue_sst2"):
        get_task("glue_sst")


# ----------------------------------------------------------------------------- TFDS

@pytest.mark.parametrize("spec", GLUE_TASKS, ids=lambda s: s.name)
def test_tfds_source_with_mock_data(spec):
    tfds = pytest.importorskip("tensorflow_datasets", reason="the TFDS path needs tensorflow-datasets")
    task = get_task(f"glue_{spec.name}")
    split = next(s for s in task.splits if "validation" in s) if spec.name != "ax" else "test"
    with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
        examples = list(task.get_dataset(split, data_dir=GLUE + "/not-here"))
        shuffled = [list(task.get_dataset(split, shuffle=True, seed=s)) for s in (5, 5)]
    assert len(examples) == 4
    prefix = f"{spec.benchmark or spec.name} "
    for ex in examples:
        assert ex["inputs_pretokenized"].startswith(prefix)
        assert ":" in ex["inputs_pretokenized"] and ex["inputs"].dtype == np.int32 and ex["inputs"][-1] == 1
        target = ex["targets_pretokenized"]
        assert target in (spec.label_names or ()) or target == "<unk>" or spec.name == "stsb"
        if spec.name == "stsb":
            assert float(target) * 5 == pytest.approx(round(float(target) * 5))
    assert [e["inputs_pretokenized"] for e in shuffled[0]] == [e["inputs_pretokenized"] for e in shuffled[1]]
    assert sorted(e["idx"] for e in shuffled[0]) == sorted(e["idx"] for e in examples)


def test_real_task_shards_are_disjoint_and_cover_and_shuffle_is_seeded():
    task = get_task("glue_rte")
    ids = lambda **kw: [ex["idx"] for ex in task.get_dataset("validation", data_dir=GLUE, **kw)]
    shards = [ids(shuffle=True, seed=7, shard_index=i, shard_count=3) for i in range(3)]
    assert sorted(i for s in shards for i in s) == list(range(277))
    assert ids(shuffle=True, seed=7) == ids(shuffle=True, seed=7) != ids(shuffle=True, seed=8)
    assert ids() == list(range(277))


def test_missing_data_names_both_ways_to_provide_it(tmp_path):
    pytest.importorskip("tensorflow_datasets", reason="the TFDS path needs tensorflow-datasets")
    with pytest.raises(FileNotFoundError, match=r"'SST-2/test\.tsv'.*tfds build glue/sst2"):
        list(get_task("glue_sst2").get_dataset("test", data_dir=str(tmp_path)))


def test_mnli_dev_sets_are_their_own_eval_tasks(tmp_path):
    (tmp_path / "MNLI").mkdir()
    for kind, label in (("matched", "neutral"), ("mismatched", "contradiction")):
        (tmp_path / "MNLI" / f"dev_{kind}.tsv").write_text(
            f"index\tsentence1\tsentence2\tgold_label\n0\tA {kind} premise.\tA hypothesis.\t{label}\n", encoding="utf-8")
        ex = next(get_task(f"glue_mnli_{kind}").get_dataset("validation", data_dir=str(tmp_path)))
        assert ex["inputs_pretokenized"] == f"mnli hypothesis: A hypothesis. premise: A {kind} premise."
        assert ex["targets_pretokenized"] == label
