"""Longformer's global tokens from gin (`global_tokens.which`) through the fine-tuning converters to
the model: "question" marks what transformers' `_compute_global_attention_mask` marks for QA (run on
the same SQuAD windows in RoBERTa's layout), "first" each example's first token as
`LongformerForSequenceClassification.forward` sets it (`global_attention_mask[:, 0] = 1`), packed rows
keep each example's own marks, the head objective and its evaluator feed them to the model, and
what cannot work is refused in one line."""
import itertools

import gin
import jax
import numpy as np
import pytest

from conftest import run_cli, shared_data_dir
from t5lite.data.catalog import get_task
from t5lite.data.converters import EXAMPLES_KEY
from t5lite.data.converter_registry import get_feature_converter
from t5lite.errors import ConfigError, DataError
from t5lite.models import windowed_attention

torch = pytest.importorskip("torch", reason="torch runs transformers' reference (extra 'hf')")
modeling_longformer = pytest.importorskip("transformers.models.longformer.modeling_longformer",
                                          reason="the Hugging Face reference (extra 'hf')")

LENGTH = 256
MASK = "encoder_global_attention_mask"


@pytest.fixture
def which():
    """Binds global_tokens.which for one test (training and evaluation read the same binding)."""
    def bind(value):
        gin.bind_parameter("global_tokens.which", value)
    yield bind
    gin.clear_config()


def _squad_windows(n=12):
    task = get_task("bert_squad_v1")
    data_dir = str(shared_data_dir() / "squad" / "v1.1")
    return list(itertools.islice(task.get_dataset("validation", {"inputs": LENGTH}, data_dir=data_dir), n))


def _hf_question_mask(tokens: np.ndarray) -> np.ndarray:
    """transformers' QA global mask for these tokens written as RoBERTa writes a pair (<s> q </s></s> c
    </s>: the first separator doubled), mapped back to the single-separator layout."""
    sep = tokens[-1]
    first = int(np.flatnonzero(tokens == sep)[0])
    roberta = np.insert(tokens, first, sep)
    mask = modeling_longformer._compute_global_attention_mask(torch.tensor(roberta[None]), int(sep))[0].numpy()
    return np.delete(mask, first).astype(np.int32)


def test_question_marks_equal_transformers_qa_global_mask(which):
    which("question")
    examples = _squad_windows()
    rows = list(get_feature_converter("encoder_span").convert(examples, {"inputs": LENGTH}))
    for ex, row in zip(examples, rows):
        n = len(ex["inputs"])
        np.testing.assert_array_equal(row[MASK][:n], _hf_question_mask(np.asarray(ex["inputs"])))
        assert not row[MASK][n:].any() and row[MASK][:n].sum() > 2   # [CLS] and the question's tokens


def test_first_marks_each_example_s_first_token_packed_or_not(which):
    which("first")
    examples = _squad_windows()[:6]
    for ex in examples:   # short pairs, so that several share a packed row
        ex["inputs"], ex["token_type_ids"] = ex["inputs"][:20], ex["token_type_ids"][:20]
    converter = get_feature_converter("encoder_span")
    unpacked = list(converter.convert(examples, {"inputs": LENGTH}))
    assert all(row[MASK].tolist() == [1] + [0] * (LENGTH - 1) for row in unpacked)
    packed = list(converter.convert(examples, {"inputs": LENGTH}, pack=True))
    assert len(packed) < len(examples)
    for row in packed:   # a 1 exactly where each segment starts
        starts = np.flatnonzero(np.diff(np.concatenate([[0], row["encoder_segment_ids"]])) > 0)
        np.testing.assert_array_equal(np.flatnonzero(row[MASK]), starts)
        assert set(converter.model_feature_lengths({"inputs": LENGTH}, pack=True)) >= set(row) - {EXAMPLES_KEY}


def test_packed_question_marks_are_each_example_s_own(which):
    which("question")
    examples = _squad_windows()[:6]
    for ex in examples:   # [CLS] question [SEP] five context tokens [SEP], so that several share a row
        tokens = np.asarray(ex["inputs"])
        end = int(np.flatnonzero(tokens == tokens[-1])[0]) + 6
        ex["inputs"], ex["token_type_ids"] = np.append(tokens[:end], tokens[-1]), np.asarray(ex["token_type_ids"])[:end + 1]
    [row, *_] = get_feature_converter("encoder_span").convert(examples, {"inputs": LENGTH}, pack=True)
    assert row["encoder_segment_ids"].max() > 1
    for k, ex in enumerate(examples[:row["encoder_segment_ids"].max()]):
        segment = row["encoder_segment_ids"] == k + 1
        np.testing.assert_array_equal(row[MASK][segment], _hf_question_mask(np.asarray(ex["inputs"])))


def test_without_a_binding_nothing_changes():
    gin.clear_config()
    row = next(get_feature_converter("encoder_span").convert(_squad_windows()[:1], {"inputs": LENGTH}))
    assert MASK not in row
    assert MASK not in get_feature_converter("encoder_span").model_feature_lengths({"inputs": LENGTH})


def _windowed_classifier():
    from t5lite.models.config import get_config
    from t5lite.objectives.finetune import ClassificationObjective
    config = get_config("bert_tiny", attention_window=4, dropout_rate=0.0)
    objective = ClassificationObjective(num_labels=2)
    module = objective.build_model(config)
    tokens = np.random.default_rng(0).integers(5, 2000, size=(2, 24)).astype(np.int32)
    params = module.init(jax.random.key(0), encoder_input_tokens=tokens, token_type_ids=np.zeros_like(tokens))["params"]
    return objective, module, params, tokens


def test_the_head_objective_feeds_the_marks_to_the_model(which):
    """A window of 4 over 24 tokens: the pooled first token sees the far tokens only as a global token."""
    which("first")
    objective, module, params, tokens = _windowed_classifier()
    marks = np.zeros_like(tokens)
    marks[:, 0] = 1
    batch = {"encoder_input_tokens": tokens, "token_type_ids": np.zeros_like(tokens), MASK: marks}
    got = objective.apply(module, params, batch)
    want = module.apply({"params": params}, encoder_input_tokens=tokens, token_type_ids=np.zeros_like(tokens),
                        encoder_global_attention_mask=marks)
    local = module.apply({"params": params}, encoder_input_tokens=tokens, token_type_ids=np.zeros_like(tokens))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert not np.allclose(np.asarray(got), np.asarray(local))


def test_global_tokens_without_a_window_are_refused(which):
    from t5lite.models.config import get_config
    from t5lite.objectives.finetune import ClassificationObjective
    which("first")
    with pytest.raises(ConfigError, match="attention_window=None"):
        ClassificationObjective().build_model(get_config("bert_tiny"))


def test_more_global_tokens_than_the_model_attends_to_are_refused():
    marks = np.zeros((2, 40), np.int32)
    marks[1, :17] = 1
    windowed_attention.check_global_tokens({MASK: marks}, 17)
    with pytest.raises(DataError, match="a row marks 17 global tokens .* max_global_tokens=16"):
        windowed_attention.check_global_tokens({MASK: marks}, 16)


def test_an_unknown_choice_is_refused(which):
    from t5lite.data.finetune_converters import global_tokens
    which("cls")
    with pytest.raises(ConfigError, match="global_tokens.which='cls'"):
        global_tokens()


@pytest.mark.usefixtures("clean_gin_state")
def test_train_and_eval_read_the_same_global_tokens(tmp_path, capsys):
    """A windowed classifier trained with global [CLS] tokens from the shipped config and two gin
    flags: `t5lite eval` with the same flag scores what training scored (the window kept from the run),
    and without it refuses in one line instead of scoring another model."""
    import json
    run = str(tmp_path / "run")
    common = ["--gin_file=configs/local/bert_tiny_finetune_sst2.gin", f"--gin.MODEL_DIR='{run}'",
              f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'", "--gin.train.eval_max_examples=64"]
    which = "--gin.global_tokens.which='first'"
    code, _, err = run_cli(capsys, "train", *common, "--gin.INITIAL_CHECKPOINT_PATH=None", "--gin.TRAIN_STEPS=4",
                     "--gin.EVAL_EVERY=4", "--gin.train.checkpoint_every=4",
                     "--gin.model_config.overrides={'attention_window': 8}", which)
    assert code == 0, err
    with open(f"{run}/metrics.jsonl") as f:
        trained = [json.loads(line)["eval_accuracy"] for line in f if "eval_accuracy" in line][-1]
    code, _, err = run_cli(capsys, "eval", *common, "--gin.eval.max_examples=64")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "global_tokens.which = 'first'" in err, err
    assert run_cli(capsys, "eval", *common, "--gin.eval.max_examples=64", which)[0] == 0
    with open(f"{run}/eval/bert_glue_sst2.validation/metrics.jsonl") as f:
        assert json.loads(f.readline())["accuracy"] == trained
