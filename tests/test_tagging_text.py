"""Text-to-text tagging: tags written as text ("PER: John Smith; LOC: Paris", or POS tags in order)
read back into the same per-word tags on every real UNER / UD sentence (also through the T5
vocabulary); entity F1 of the text path equals seqeval on the same predictions; t5_tiny trains
on `uner_en_ewt_t2t` and is scored with entity F1."""
import json
import os
import random

import pytest
from conftest import REPO, shared_data_dir

from t5lite import cli, metrics
from t5lite.data import get_task
from t5lite.data import tagging_text as T
from t5lite.data.sources import Conll
from t5lite.train import trainer

seqeval_metrics = pytest.importorskip("seqeval.metrics", reason="seqeval is the reference for entity F1")
from seqeval.metrics.sequence_labeling import get_entities  # noqa: E402

UD = str(shared_data_dir() / "ud")
TYPES = ("PER", "LOC", "ORG")
LENGTHS = {"inputs": 512, "targets": 512}


def uner(split):
    return [ex for _, ex in Conll(tag_column=2)(os.path.join(UD, "uner_en_ewt", f"en_ewt-ud-{split}.iob2"))]


def test_entities_round_trip_on_every_uner_sentence():
    sentences = uner("dev") + uner("test")
    assert sum(bool(get_entities(ex["tags"])) for ex in sentences) > 1000
    for ex in sentences:
        text = T.entities_text(ex["words"], ex["tags"])
        assert get_entities(T.entity_tags(ex["words"], text, TYPES)) == get_entities(ex["tags"]), text


@pytest.mark.parametrize("name", ["uner_en_ewt_t2t", "ud_en_ewt_upos_t2t"])
def test_task_targets_decode_back_to_the_gold_tags(name):
    """Through the task's own tokenizer (T5's SentencePiece): decode(targets) -> the same tags."""
    task = get_task(name)
    vocabulary = task.output_features["targets"].vocabulary
    examples = list(task.get_dataset("test", LENGTHS, data_dir=UD))
    assert len(examples) == 2077
    for ex in examples:
        assert ex["inputs_pretokenized"].split()[1:] == " ".join(ex["words"]).split()
        predicted = task.postprocess(vocabulary.decode(list(ex["targets"][:-1])), example=ex, is_target=False)
        if name == "ud_en_ewt_upos_t2t":
            assert predicted == ex["tags"], ex["id"]
        else:
            assert get_entities(predicted) == get_entities(ex["tags"]), ex["id"]
        assert task.postprocess("anything", example=ex, is_target=True) == ex["tags"]


def test_parsing_places_spans_in_order_and_drops_what_is_not_in_the_sentence():
    words = "John met John Smith in Paris , not John".split()
    text = "PER: John; PER: John; MISC: Paris; LOC: Rome; ORG Paris; PER: John Smith;LOC:  Paris "
    # The second "John" goes after the first; "John Smith" then has no free place; MISC is no type
    # of the task, Rome is not in the sentence and "ORG Paris" has no ": ".
    assert T.entity_tags(words, text, TYPES) == ["B-PER", "O", "B-PER", "O", "O", "B-LOC", "O", "O", "O"]
    # An entity spelled twice in a row: the two occurrences, then the first free one.
    assert T.entity_tags(["a", "b", "a"], "PER: a; PER: a; PER: a", TYPES) == ["B-PER", "O", "B-PER"]
    assert T.entity_tags(["a", "b"], "", TYPES) == ["O", "O"]
    assert T.sequence_tags(["a", "b", "c"], "NOUN VERB") == ["NOUN", "VERB", T.MISSING]
    assert T.sequence_tags(["a"], "NOUN VERB") == ["NOUN"]


def test_entity_f1_of_the_text_path_equals_seqeval():
    """Predicted tags (gold ones corrupted: wrong types, shifted and lone I- tags) written as the
    model would write them, read back by the task and scored by its metrics, give seqeval's
    numbers on those predicted tags."""
    task = get_task("uner_en_ewt_t2t")
    examples = list(task.get_dataset("test", LENGTHS, data_dir=UD))[:400]
    rng = random.Random(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
    gold, predicted, targets, decoded = [], [], [], []
    for ex in examples:
        guess = [rng.choice(tags) if rng.random() < 0.1 else tag for tag in ex["tags"]]
        gold.append(ex["tags"])
        predicted.append(guess)
        targets.append(task.postprocess(ex["targets_pretokenized"], example=ex, is_target=True))
        decoded.append(task.postprocess(T.entities_text(ex["words"], guess), example=ex, is_target=False))
    assert targets == gold
    ours = metrics.compute_metrics(task.metric_fns, targets, decoded)
    expected = {"entity_precision": seqeval_metrics.precision_score(gold, predicted, zero_division=0),
                "entity_recall": seqeval_metrics.recall_score(gold, predicted, zero_division=0),
                "entity_f1": seqeval_metrics.f1_score(gold, predicted, zero_division=0)}
    report = seqeval_metrics.classification_report(gold, predicted, output_dict=True, zero_division=0)
    expected.update({f"{t}_f1": report[t]["f1-score"] for t in TYPES})
    assert 0.3 < expected["entity_f1"] < 0.95
    for key, value in expected.items():
        assert ours[key] == pytest.approx(100 * value, rel=1e-9), key


@pytest.mark.usefixtures("clean_gin_state")
def test_t5_tiny_trains_on_uner_as_text_and_is_scored_with_entity_f1(tmp_path):
    out = str(tmp_path / "t2t")
    config = REPO / "configs/local/t5_tiny_finetune_uner.gin"
    cli.parse_gin([str(config)], [f"MODEL_DIR = '{out}'", "INITIAL_CHECKPOINT_PATH = None", f"DATA_DIR = '{UD}'",
                                  "TRAIN_STEPS = 3", "EVAL_EVERY = 3", "BATCH_SIZE = 4", "train.log_every = 1",
                                  "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 16}",
                                  "train.eval_max_examples = 8"], entry=("train", trainer.train))
    trainer.train(progress=False)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert all(r["loss"] > 0 for r in records if "loss" in r)
    evals = [r for r in records if "eval_entity_f1" in r]
    assert [r["step"] for r in evals] == [3]
    assert {"eval_entity_precision", "eval_entity_recall", "eval_token_accuracy"} <= set(evals[0])
