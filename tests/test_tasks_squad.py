"""SQuAD tasks on the official dev files in ../shared/data/squad, plus the TFDS path under mock_data."""
import collections
import functools
import json

import numpy as np
import pytest
from conftest import shared_data_dir

from t5lite import metrics
from t5lite.data import get_task
from t5lite.data.sources import MalformedRowError
from t5lite.data.tasks.squad import pad_punctuation

SHARED = shared_data_dir()  # <repo>/../shared/data or $T5LITE_SHARED_DATA
V1, V2 = str(SHARED / "squad" / "v1.1"), str(SHARED / "squad" / "v2.0")


@functools.cache
def _formatted(task, data_dir, split="validation"):
    """Formatted but not tokenized, so whole files stay fast."""
    t = get_task(task)
    return list(t.preprocessors[0](t.source.load(split, data_dir=data_dir)))


def test_pad_punctuation_matches_t5_re2_semantics():
    # Today's t5: RE2's [[:punct:]] is ASCII punctuation; dashes and accents stay; ASCII whitespace collapses.
    assert pad_punctuation("Levi's Stadium (2016), 24–10.") == "Levi ' s Stadium ( 2016 ) , 24–10 . "
    assert pad_punctuation("café  au\tlait") == "café au lait"
    assert pad_punctuation("a\u00a0b") == "a\u00a0b"
    assert pad_punctuation("snake_case 42") == "snake _ case 42"
    # The paper-era rule: RE2's \W is ASCII-only, so accented letters and dashes are padded too.
    assert pad_punctuation("Levi's 24–10.", rule="non_word") == "Levi ' s 24 – 10 . "
    assert pad_punctuation("café  au\tlait", rule="non_word") == "caf é au lait"
    assert pad_punctuation("a\u00a0b", rule="non_word") == "a \u00a0 b"
    assert pad_punctuation("snake_case 42", rule="non_word") == "snake_case 42"
    with pytest.raises(ValueError, match="unknown punctuation rule 'ascii'"):
        pad_punctuation("x", rule="ascii")


def test_first_v1_question_exact():
    ex = next(get_task("squad_v1").get_dataset("validation", data_dir=V1))
    assert ex["inputs_pretokenized"].startswith(
        "question: Which NFL team represented the AFC at Super Bowl 50 ? context: Super Bowl 50 was an American "
        "football game to determine the champion of the National Football League ( NFL ) for the 2015 season . The "
        "American Football Conference ( AFC ) champion Denver Broncos defeated the National Football Conference ( NFC"
        " ) champion Carolina Panthers 24–10 to earn their third Super Bowl title . The game was played on February"
        " 7 , 2016 , at Levi ' s Stadium in the San Francisco Bay Area at Santa Clara , California .")
    assert ex["inputs_pretokenized"].endswith(
        "as well as temporarily suspending the tradition of naming each Super Bowl game with Roman numerals ( under "
        "which the game would have been known as \" Super Bowl L \" ) , so that the logo could prominently feature "
        "the Arabic numerals 50 . ")
    assert ex["targets_pretokenized"] == "Denver Broncos"
    assert ex["answers"] == ["Denver Broncos"] * 3 and ex["id"] == "56be4db0acb8001400a502ec"
    assert ex["inputs"].dtype == np.int32 and ex["targets"][-1] == 1


def test_v1_counts_and_all_answers_kept():
    examples = _formatted("squad_v1", V1)
    assert len(examples) == 10570
    multi = next(e for e in examples if len(set(e["answers"])) > 1)
    assert multi["targets"] == multi["answers"][0]


def test_v2_unanswerable_marker_and_counts():
    examples = _formatted("squad_v2", V2)
    assert len(examples) == 11873
    impossible = [e for e in examples if e["targets"] == "unanswerable"]
    assert len(impossible) == 5945 and all(e["answers"] == [""] for e in impossible)
    first = impossible[0]
    assert first["id"] == "5ad39d53604f3c001a3fe8d1"
    assert first["inputs"].startswith("question: Who gave their name to Normandy in the 1000 ' s and 1100 ' s "
                                      "context: The Normans ( Norman : Nourmands ; French : Normands ;")
    assert examples[1]["targets"] == "10th and 11th centuries"
    assert examples[1]["answers"] == ["10th and 11th centuries", "in the 10th and 11th centuries",
                                      "10th and 11th centuries", "10th and 11th centuries"]


def test_postprocess_gives_all_answers_to_the_metric():
    task = get_task("squad_v2")
    examples = _formatted("squad_v2", V2)[:6]  # five answerable, then an unanswerable one
    targets = [task.postprocess(e["targets"], example=e, is_target=True) for e in examples]
    assert targets[1] == examples[1]["answers"] and targets[5] == [""]
    predictions = [task.postprocess(p) for p in
                   ("France", "in the 10th and 11th centuries", "Denmark", "Rollo", "10th", "unanswerable")]
    assert predictions[5] == ""
    scores = metrics.compute_metrics(task.metric_fns, targets, predictions)
    assert scores["em"] == pytest.approx(100 * 5 / 6)  # "Denmark" vs "Denmark , Iceland and Norway" misses


def test_split_mapping():
    assert get_task("squad_v1").splits == ("train", "validation")
    files = get_task("squad_v1").source.files
    assert files.files("validation", V1) == [f"{V1}/dev-v1.1.json"] and files.files("train", V1) == []


def test_malformed_questions(tmp_path, monkeypatch):
    qas = [{"id": "a", "question": "Who?", "answers": [{"text": "Me", "answer_start": 0}]},
           {"id": "b", "answers": [{"text": "x", "answer_start": 0}]},  # no question
           {"id": "c", "question": "None?", "answers": []}]              # v1.1 needs an answer
    data = {"data": [{"title": "T", "paragraphs": [{"context": "Me, myself.", "qas": qas}]}]}
    (tmp_path / "dev-v1.1.json").write_text(json.dumps(data))
    with pytest.raises(MalformedRowError, match=r"dev-v1\.1\.json:data\[0\]\.paragraphs\[0\]\.qas\[1\]"):
        list(get_task("squad_v1").get_dataset("validation", data_dir=str(tmp_path)))
    monkeypatch.setattr(get_task("squad_v1").source.files, "on_malformed", "skip")
    got = list(get_task("squad_v1").get_dataset("validation", data_dir=str(tmp_path)))
    assert [(e["inputs_pretokenized"], e["targets_pretokenized"]) for e in got] == [
        ("question: Who ? context: Me , myself . ", "Me")]


@pytest.mark.parametrize("name, tfds_name", [("squad_v1", "squad/v1.1"), ("squad_v2", "squad/v2.0")])
def test_tfds_source_with_mock_data(name, tfds_name):
    tfds = pytest.importorskip("tensorflow_datasets", reason="the TFDS path needs tensorflow-datasets")
    task = get_task(name)
    assert task.source.tfds.name == tfds_name
    with tfds.testing.mock_data(num_examples=3, policy=tfds.testing.MockPolicy.USE_CODE):
        examples = list(task.get_dataset("train"))
    assert len(examples) == 3
    for ex in examples:
        assert ex["inputs_pretokenized"].startswith("question: ") and " context: " in ex["inputs_pretokenized"]
        assert isinstance(ex["answers"], list) and all(isinstance(a, str) for a in ex["answers"])
        assert ex["targets_pretokenized"] == (ex["answers"][0] if ex["answers"] != [""] else "unanswerable")
        assert collections.Counter(type(v).__name__ for v in ex["inputs"]) == {"int32": len(ex["inputs"])}
