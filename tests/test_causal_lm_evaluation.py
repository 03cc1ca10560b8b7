"""A causal LM pre-training run is evaluated by its held-out loss, as nanoGPT's `estimate_loss` does
(the mean next-token cross entropy over validation rows): per real target token of the split's packed
rows, without dropout or z-loss, with its perplexity and next-token accuracy; the reference is numpy
over the model's logits. The shipped GPT-2 config evaluates so during training and in `t5lite eval`."""
import contextlib
import json
import os

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

from conftest import REPO, assert_close
from t5lite import cli, models
from t5lite.data import catalog, converter_registry
from t5lite.errors import ConfigError
from t5lite.objectives.causal_lm import CausalLmObjective

LENGTHS = {"targets": 32}


def _numpy_heldout_loss(module, params, rows):
    """nanoGPT's estimate_loss (karpathy/nanoGPT, train.py: F.cross_entropy over the logits of each val
    batch), taken per real target token over all the rows at once, with its next-token accuracy."""
    forward = jax.jit(lambda row: module.apply({"params": params}, **row))
    losses, hits = [], []
    for row in rows:
        features = {k: v[None] for k, v in row.items() if k.startswith("decoder_")}
        log_p = scipy.special.log_softmax(np.asarray(forward(features)[0], np.float64), axis=-1)
        for position in np.flatnonzero(row["decoder_loss_weights"]):
            target = row["decoder_target_tokens"][position]
            losses.append(-log_p[position, target])
            hits.append(log_p[position].argmax() == target)
    return float(np.mean(losses)), float(np.mean(hits)), len(losses)


def test_causal_lm_evaluation_is_numpys_token_cross_entropy_over_the_packed_split_without_dropout():
    task = catalog.get_task_or_mixture("embedded_docs_causal_lm")
    objective = CausalLmObjective()
    module = objective.build_model(models.get_config("gpt2_tiny", vocab_size=2176, dropout_rate=0.3))
    params = module.init(jax.random.key(1), decoder_input_tokens=jnp.ones((1, 32), jnp.int32))["params"]
    (evaluator,) = objective.evaluators(task, "validation", LENGTHS, batch_size=2, max_examples=7).values()
    result = evaluator.evaluate(module, params)

    examples = list(task.get_dataset("validation", LENGTHS))[:7]
    rows = list(converter_registry.get_feature_converter("decoder").convert(examples, LENGTHS, pack=True))
    assert len(rows) == 7 and all("decoder_segment_ids" in row for row in rows)   # as training packs; a short batch
    loss, accuracy, tokens = _numpy_heldout_loss(module, params, rows)
    assert tokens == sum(len(ex["targets"]) for ex in examples)
    assert set(result.metrics) == {"loss", "accuracy", "perplexity"} and result.predictions == []
    assert result.num_examples() == 7   # the examples scored, not the predictions (a loss makes none)
    assert_close(result.metrics["loss"], loss, rtol=1e-5)
    assert_close(result.metrics["accuracy"], accuracy, rtol=1e-5)
    assert_close(result.metrics["perplexity"], np.exp(loss), rtol=1e-4)


def test_causal_lm_objective_refuses_a_model_that_is_not_decoder_only():
    with pytest.raises(ConfigError, match="arch='encoder_decoder'.*gpt2_"):
        CausalLmObjective().build_model(models.get_config("t5_tiny"))


@contextlib.contextmanager
def _in_repo():
    """In the repository (the configs include gin/ pieces by relative paths); gin cleared after."""
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        yield
    finally:
        os.chdir(cwd)
        gin.clear_config()


def _cli(*args):
    with _in_repo():
        cli.main(list(args))


def test_gpt2_configs_train_with_the_causal_lm_objective():
    """The fast sibling of the run below: both configs over the causal LM task name its objective."""
    import t5lite.train.trainer  # noqa: F401  (registers `train`)
    for name in ("gpt2_tiny_pretrain", "gpt2_tiny_fewshot_eval"):
        with _in_repo():
            gin.parse_config_file(f"configs/local/{name}.gin")
            assert gin.query_parameter("train.objective").selector == "CausalLmObjective"


@pytest.mark.slow
def test_gpt2_config_evaluates_its_heldout_loss_in_training_and_in_eval(tmp_path):
    config = "--gin_file=configs/local/gpt2_tiny_pretrain.gin"
    _cli("train", config, f"--gin.MODEL_DIR='{tmp_path}'", "--gin.TRAIN_STEPS=2", "--gin.BATCH_SIZE=4",
         "--gin.TASK_FEATURE_LENGTHS={'targets': 32}", "--gin.train.eval_every=1", "--gin.train.eval_max_examples=5")
    with open(tmp_path / "metrics.jsonl") as f:
        evaluations = [r for r in map(json.loads, f) if "eval_loss" in r]
    assert [r["step"] for r in evaluations] == [1, 2]
    last = evaluations[-1]
    assert 0.0 <= last["eval_accuracy"] <= 1.0 and np.isfinite(last["eval_loss"])
    assert_close(last["eval_perplexity"], np.exp(last["eval_loss"]), rtol=1e-5)
    assert 0 < last["eval_unigram_loss"] < last["eval_loss"]   # two steps from random weights: worse than frequencies

    _cli("eval", config, f"--gin.CHECKPOINT_PATH='{tmp_path}'", "--gin.TASK_FEATURE_LENGTHS={'targets': 32}",
         "--gin.eval.max_examples=5")
    with open(tmp_path / "eval" / "embedded_docs_causal_lm.validation" / "metrics.jsonl") as f:
        (record,) = map(json.loads, f)
    assert record["examples"] == 5
    for key in ("loss", "accuracy", "perplexity"):
        assert_close(record[key], last[f"eval_{key}"], rtol=1e-5)
