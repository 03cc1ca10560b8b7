"""SuperGLUE tasks: T5's formats on made-up examples, SuperGLUE's own .jsonl layout written in tmp_path,
and every task through TFDS under mock_data."""
import importlib.util
import json

import numpy as np
import pytest

from t5lite import metrics
from t5lite.data import get_mixture, get_task

PASSAGE = ("The Thames flooded.\n@highlight\nRiver bursts its banks\n@highlight\nResidents leave \"home\"\n"
           "@highlight\nCouncil responds")


def _formatted(task_name, examples):
    return list(get_task(task_name).preprocessors[0](examples))


def test_glue_style_formats():
    boolq = {"question": "is it wet", "passage": "Water is wet.", "label": 1, "idx": 3}
    assert _formatted("super_glue_boolq", [boolq]) == [
        {"inputs": "boolq passage: Water is wet. question: is it wet", "targets": "True", "idx": 3}]
    cb = {"premise": "P.", "hypothesis": "H.", "label": 2, "idx": 0}
    assert _formatted("super_glue_cb", [cb])[0]["inputs"] == "cb hypothesis: H. premise: P."
    assert _formatted("super_glue_cb", [cb])[0]["targets"] == "neutral"
    copa = {"premise": "It rained.", "choice1": "Wet.", "choice2": "Dry.", "question": "effect", "label": 0, "idx": 1}
    assert _formatted("super_glue_copa", [copa])[0]["inputs"] == \
        "copa choice1: Wet. choice2: Dry. premise: It rained. question: effect"
    wic = {"word": "bank", "sentence1": "A river bank.", "sentence2": "A bank loan.", "start1": 8, "end1": 12,
           "start2": 2, "end2": 6, "label": 0, "idx": 7}
    assert _formatted("super_glue_wic", [wic])[0] == {
        "inputs": "wic sentence1: A river bank. sentence2: A bank loan. word: bank", "targets": "False", "idx": 7}
    axb = {"sentence1": "S1.", "sentence2": "S2.", "label": -1, "idx": 0}
    assert _formatted("super_glue_axb", [axb])[0]["inputs"] == "rte hypothesis: S2. premise: S1."
    assert _formatted("super_glue_axb", [axb])[0]["targets"] == "<unk>"


def test_multirc_format_postprocess_and_metrics():
    ex = {"paragraph": "Sent 1: <b>Bold</b> text.<br>Sent 2: more.", "question": "What?", "answer": "Bold",
          "label": 1, "idx": {"paragraph": 0, "question": 5, "answer": 2}}
    out = _formatted("super_glue_multirc", [ex])[0]
    assert out["inputs"] == "multirc question: What? answer: Bold paragraph: Sent 1: Bold text. Sent 2: more."
    assert out["targets"] == "True" and (out["idx/question"], out["idx/answer"]) == (5, 2)
    task = get_task("super_glue_multirc")
    assert task.postprocess("True", example=out, is_target=True) == {"value": 1, "group": (0, 5)}
    assert task.postprocess("maybe") == {"value": -1}
    targets = [{"value": 1, "group": (0, 5)}, {"value": 0, "group": (0, 5)}, {"value": 1, "group": (0, 6)}]
    preds = [{"value": 1}, {"value": 0}, {"value": 0}]
    assert metrics.compute_metrics(task.metric_fns, targets, preds) == {"f1": pytest.approx(200 / 3),
                                                                        "exact_match": 50.0}


def test_record_one_example_per_answer():
    ex = {"passage": PASSAGE, "query": "@placeholder flooded.", "entities": ["Thames", "Council"],
          "answers": ["Thames", "The Thames"], "idx": {"passage": 4, "query": 9}}
    outs = _formatted("super_glue_record", [ex])
    assert [o["targets"] for o in outs] == ["Thames", "The Thames"]
    assert outs[0]["inputs"] == ("record query: @placeholder flooded. entities: Thames, Council passage: The Thames "
                                 "flooded. River bursts its banks. Residents leave \"home\" Council responds")
    task = get_task("super_glue_record")
    targets = [task.postprocess(o["targets"], example=o, is_target=True) for o in outs]
    assert targets[0] == {"value": ["Thames", "The Thames"], "group": (4, 9)}
    scores = metrics.compute_metrics(task.metric_fns, targets, [task.postprocess("thames")] * 2)
    assert scores == {"em": 100.0, "f1": 100.0}  # the query counts once
    assert [o["targets"] for o in _formatted("super_glue_record", [{**ex, "answers": []}])] == ["<unk>"]


WSC = [
    {"text": "Mitchell asked Tom if he could lend some money.", "span1_text": "Tom", "span1_index": 2,
     "span2_text": "he", "span2_index": 4, "label": 1, "idx": 0},
    {"text": "Mitchell asked Tom if he could lend some money.", "span1_text": "Mitchell", "span1_index": 0,
     "span2_text": "he", "span2_index": 4, "label": 0, "idx": 1},
    # The pronoun carries punctuation, and the index points next to the pronoun: T5's two special cases.
    {"text": "John laughed. \"Good for him,\" he said. ", "span1_text": "the pony", "span1_index": 0,
     "span2_text": "him", "span2_index": 5, "label": 1, "idx": 2},
    {"text": "Some day they might want to use it , but not now.", "span1_text": "the pebble", "span1_index": 0,
     "span2_text": "it", "span2_index": 6, "label": 1, "idx": 3},
]


def test_wsc_simple_format():
    outs = _formatted("super_glue_wsc", WSC)
    assert [(o["inputs"], o["targets"], o["label"]) for o in outs] == [
        ("wsc: Mitchell asked Tom if *he* could lend some money.", "Tom", 1),
        ("wsc: Mitchell asked Tom if *he* could lend some money.", "Mitchell", 0),
        ("wsc: John laughed. \"Good for *him* ,\" he said. ", "the pony", 1),
        ("wsc: Some day they might want to use *it* , but not now.", "the pebble", 1)]
    assert [o["idx"] for o in _formatted("super_glue_wsc_train", WSC)] == [0, 2, 3]


def test_wsc_postprocess():
    task = get_task("super_glue_wsc")
    ex = {"targets_pretokenized": "the fuzzy bunny", "label": 1}
    assert task.postprocess("bunny", example=ex) == 1
    assert task.postprocess("The Fuzzy Bunny's", example=ex) == 0   # possessive vs plain name
    assert task.postprocess("the cat", example=ex) == 0
    assert task.postprocess("the", example=ex) == -1                # nothing but a determiner
    assert task.postprocess("whatever", example=ex, is_target=True) == 1


def _write_jsonl(root, path, *rows):
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _texts(name, split, data_dir):
    return [(e["inputs_pretokenized"], e["targets_pretokenized"])
            for e in get_task(name).get_dataset(split, data_dir=str(data_dir))]


def test_local_jsonl_simple_tasks(tmp_path):
    _write_jsonl(tmp_path, "BoolQ/val.jsonl", {"question": "is water wet", "passage": "Water is wet.", "idx": 0,
                                               "label": True})
    _write_jsonl(tmp_path, "CB/val.jsonl", {"premise": "P.", "hypothesis": "H.", "label": "contradiction", "idx": 0})
    _write_jsonl(tmp_path, "COPA/val.jsonl", {"premise": "It rained.", "choice1": "Wet.", "choice2": "Dry.",
                                              "question": "effect", "idx": 0, "label": 1})
    _write_jsonl(tmp_path, "WiC/test.jsonl", {"word": "bank", "sentence1": "A river bank.", "sentence2": "A bank.",
                                              "start1": 8, "end1": 12, "start2": 2, "end2": 6, "idx": 0})
    _write_jsonl(tmp_path, "AX-b/AX-b.jsonl", {"sentence1": "S1.", "sentence2": "S2.", "label": "entailment", "idx": 0})
    assert _texts("super_glue_boolq", "validation", tmp_path) == [
        ("boolq passage: Water is wet. question: is water wet", "True")]
    assert _texts("super_glue_cb", "validation", tmp_path) == [("cb hypothesis: H. premise: P.", "contradiction")]
    assert _texts("super_glue_copa", "validation", tmp_path) == [
        ("copa choice1: Wet. choice2: Dry. premise: It rained. question: effect", "choice2")]
    assert _texts("super_glue_wic", "test", tmp_path) == [
        ("wic sentence1: A river bank. sentence2: A bank. word: bank", "<unk>")]
    assert _texts("super_glue_axb", "test", tmp_path) == [("rte hypothesis: S2. premise: S1.", "entailment")]
    assert get_task("super_glue_boolq").source.files.files("validation", str(tmp_path)) == [
        str(tmp_path / "BoolQ" / "val.jsonl")]


def test_local_jsonl_multirc_record_wsc(tmp_path):
    _write_jsonl(tmp_path, "MultiRC/val.jsonl", {"idx": 3, "passage": {"text": "Sent 1: <b>A</b> b.", "questions": [
        {"question": "What?", "idx": 7, "answers": [{"text": "A", "idx": 0, "label": 1},
                                                      {"text": "B", "idx": 1, "label": 0}]}]}})
    multirc = list(get_task("super_glue_multirc").get_dataset("validation", data_dir=str(tmp_path)))
    assert [(e["inputs_pretokenized"], e["targets_pretokenized"], e["idx/question"], e["idx/answer"])
            for e in multirc] == [("multirc question: What? answer: A paragraph: Sent 1: A b.", "True", 7, 0),
                                  ("multirc question: What? answer: B paragraph: Sent 1: A b.", "False", 7, 1)]
    text = "The Thames flooded.\n@highlight\nCouncil responds"
    _write_jsonl(tmp_path, "ReCoRD/val.jsonl", {"idx": 1, "passage": {"text": text, "entities": [
        {"start": 4, "end": 9}, {"start": 31, "end": 37}, {"start": 4, "end": 9}]}, "qas": [
        {"query": "@placeholder flooded.", "idx": 5, "answers": [{"start": 4, "end": 9, "text": "Thames"}]}]})
    (record,) = get_task("super_glue_record").get_dataset("validation", data_dir=str(tmp_path))
    assert record["inputs_pretokenized"] == ("record query: @placeholder flooded. entities: Council, Thames passage: "
                                             "The Thames flooded. Council responds")
    assert (record["targets_pretokenized"], record["answers"], record["idx/query"]) == ("Thames", ["Thames"], 5)
    _write_jsonl(tmp_path, "WSC/val.jsonl", {
        "text": "Mark told Pete many lies about himself. He should have been more skeptical.",
        "target": {"span1_index": 2, "span1_text": "pete", "span2_index": 7, "span2_text": "He"}, "idx": 0,
        "label": True})
    assert _texts("super_glue_wsc", "validation", tmp_path) == [  # span1 case fixed as TFDS's wsc.fixed does
        ("wsc: Mark told Pete many lies about himself. *He* should have been more skeptical.", "Pete")]


def test_local_jsonl_malformed_row(tmp_path, monkeypatch):
    _write_jsonl(tmp_path, "BoolQ/val.jsonl", {"question": "q?", "passage": "P.", "idx": 0, "label": False},
                 {"question": "no passage", "idx": 1, "label": True}, "{not json")
    with pytest.raises(ValueError, match=r"BoolQ/val\.jsonl:2: bad boolq row \(KeyError: 'passage'\)"):
        _texts("super_glue_boolq", "validation", tmp_path)
    monkeypatch.setattr(get_task("super_glue_boolq").source.files, "on_malformed", "skip")
    assert _texts("super_glue_boolq", "validation", tmp_path) == [("boolq passage: P. question: q?", "False")]


def _patch_tf_free(monkeypatch):
    """TFDS's super_glue builder names `tf.int32` for most configs' features; without TensorFlow,
    numpy's int32 stands in (the generated features are the same)."""
    if importlib.util.find_spec("tensorflow") is None:
        import tensorflow_datasets.text.super_glue as builder
        monkeypatch.setattr(builder, "tf", type("tf", (), {"int32": np.int32}))


@pytest.mark.parametrize("name, prefix", [
    ("boolq", "boolq passage: "), ("cb", "cb hypothesis: "), ("copa", "copa choice1: "),
    ("rte", "rte hypothesis: "), ("wic", "wic sentence1: "), ("multirc", "multirc question: "),
    ("record", "record query: "), ("axb", "rte hypothesis: "), ("axg", "rte hypothesis: ")])
def test_tfds_source_with_mock_data(name, prefix, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets", reason="the TFDS path needs tensorflow-datasets")
    _patch_tf_free(monkeypatch)
    task = get_task(f"super_glue_{name}")
    split = "test" if name.startswith("ax") else "validation"
    with tfds.testing.mock_data(num_examples=3, policy=tfds.testing.MockPolicy.USE_CODE):
        examples = list(task.get_dataset(split))
    assert len(examples) >= 3 and all(e["inputs_pretokenized"].startswith(prefix) for e in examples)
    assert all(e["inputs"].dtype == np.int32 and e["targets"][-1] == 1 for e in examples)


def test_tfds_wsc_with_mock_examples(monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets", reason="the TFDS path needs tensorflow-datasets")
    _patch_tf_free(monkeypatch)
    with tfds.testing.mock_data(as_data_source_fn=lambda *args, **kwargs: WSC):
        examples = list(get_task("super_glue_wsc").get_dataset("validation"))
        train = list(get_task("super_glue_wsc_train").get_dataset("train"))
    assert [e["inputs_pretokenized"] for e in examples] == [o["inputs"] for o in _formatted("super_glue_wsc", WSC)]
    assert [e["targets_pretokenized"] for e in train] == ["Tom", "the pony", "the pebble"]


def test_mixture_samples_training_tasks_only():
    mixture = get_mixture("super_glue_proportional")
    rates = dict(zip((t.name for t in mixture.tasks), mixture.rates("train")))
    assert rates["super_glue_wsc_train"] > 0 and rates["dpr_v001_simple"] > 0
    assert rates["super_glue_wsc"] == rates["super_glue_axb"] == rates["super_glue_axg"] == 0
    assert len(rates) == 12


def test_dpr_release_files(tmp_path):
    (tmp_path / "test.c.txt").write_text(
        "Bob asked Tom if he can lend some money.\nhe\nBob,Tom\nTom\n\n"
        "The cat chased the mouse because it was hungry.\nit\nthe cat, the mouse\nthe cat\n\n", encoding="utf-8")
    examples = list(get_task("dpr_v001_simple").get_dataset("test", data_dir=str(tmp_path)))
    assert [(e["inputs_pretokenized"], e["targets_pretokenized"]) for e in examples] == [
        ("wsc: Bob asked Tom if *he* can lend some money.", "Tom"),
        ("wsc: The cat chased the mouse because *it* was hungry.", "the cat")]
    (tmp_path / "train.c.txt").write_text("A saw B.\nhe\nA,B\nC\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="answer 'C' is not one of the candidates"):
        list(get_task("dpr_v001_simple").get_dataset("train", data_dir=str(tmp_path)))
