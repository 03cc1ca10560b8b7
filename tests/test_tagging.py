"""Token tagging end to end: bert_tiny trained a few steps on UNER (dev), evaluated on test by
training and by `t5lite eval`; the CoNLL file it writes carries the source file's gold tags, and
seqeval reading that file gives the reported numbers."""
import json
import os

import gin
import pytest
from conftest import REPO, shared_data_dir

from t5lite import cli
from t5lite.data.sources import Conll
from t5lite.train import trainer

seqeval_metrics = pytest.importorskip("seqeval.metrics", reason="seqeval is the reference for entity F1")
UD = str(shared_data_dir() / "ud")
CONFIG = "configs/local/bert_tiny_finetune_uner.gin"
N = 12   # test sentences evaluated


pytestmark = pytest.mark.usefixtures("clean_gin_state")


def read_conll(path):
    """(words, gold, predicted) sentences of a conlleval-layout file."""
    sentences, current = [], ([], [], [])
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                sentences.append(current)
                current = ([], [], [])
                continue
            for column, value in zip(current, line.split()):
                column.append(value)
    return sentences


def test_bert_tiny_uner_trains_and_writes_conll_scored_as_seqeval(tmp_path):
    out = str(tmp_path / "ft")
    cli.parse_gin([str(REPO / CONFIG)], [f"MODEL_DIR = '{out}'", "INITIAL_CHECKPOINT_PATH = None", f"DATA_DIR = '{UD}'",
                                         "TRAIN_STEPS = 3", "EVAL_EVERY = 3", "BATCH_SIZE = 4",
                                         "TASK_FEATURE_LENGTHS = {'inputs': 16}", f"train.eval_max_examples = {N}",
                                         "train.log_every = 1"], entry=("train", trainer.train))
    trainer.train(progress=False)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert {"loss", "accuracy"} <= set(records[0])
    evals = [r for r in records if "eval_entity_f1" in r]
    assert [r["step"] for r in evals] == [3]

    gin.clear_config()
    folder = os.path.join(out, "eval", "uner_en_ewt.test")
    cli.main(["eval", f"--gin_file={REPO / CONFIG}", f"--gin.MODEL_DIR='{out}'", f"--gin.DATA_DIR='{UD}'",
              "--gin.TASK_FEATURE_LENGTHS={'inputs': 16}", f"--gin.eval.max_examples={N}", "--gin.eval.batch_size=4"])
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f][-1]
    assert metrics["entity_f1"] == pytest.approx(evals[0]["eval_entity_f1"])

    sentences = read_conll(os.path.join(folder, "predictions.conll"))
    # Windows of 14 subwords: the N windows cover fewer sentences, each whole.
    source = [ex for _, ex in Conll(tag_column=2)(os.path.join(UD, "uner_en_ewt", "en_ewt-ud-test.iob2"))]
    assert 1 < len(sentences) < N
    for (words, gold, predicted), ex in zip(sentences, source):
        assert words == ["_".join(w.split()) for w in ex["words"]] and gold == ex["tags"]
        assert len(predicted) == len(gold)
    gold = [s[1] for s in sentences]
    predicted = [s[2] for s in sentences]
    expected = {"entity_precision": seqeval_metrics.precision_score(gold, predicted, zero_division=0),
                "entity_recall": seqeval_metrics.recall_score(gold, predicted, zero_division=0),
                "entity_f1": seqeval_metrics.f1_score(gold, predicted, zero_division=0),
                "token_accuracy": seqeval_metrics.accuracy_score(gold, predicted)}
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(100 * value, rel=1e-6, abs=1e-9), key


def test_a_head_of_the_wrong_size_is_a_config_error():
    import jax
    from t5lite import models
    from t5lite.errors import ConfigError
    from t5lite.objectives.finetune import TaggingObjective
    from t5lite.data import get_task
    objective = TaggingObjective(num_tags=5)
    module = objective.build_model(models.get_config("bert_tiny", vocab_size=2176))
    evaluator = objective.evaluators(get_task("uner_en_ewt"), "test", {"inputs": 16}, data_dir=UD, max_examples=2,
                                     batch_size=2)["uner_en_ewt"]
    params = module.init(jax.random.key(0), **objective.init_features({"encoder_input_tokens": 16,
                                                                        "token_type_ids": 16}))["params"]
    with pytest.raises(ConfigError, match="TaggingObjective.num_tags = 7"):
        evaluator.evaluate(module, params)
