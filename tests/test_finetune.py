"""Fine-tuning: the run starts from the pre-trained parameters and evaluates while it trains; the
CLI chains pre-training, fine-tuning, `eval` and `infer` (slow), and names missing macros."""
import json
import os
import subprocess
import sys

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from conftest import REPO, shared_data_dir

from t5lite import cli, models
from t5lite.errors import ConfigError
from t5lite.data import get_task
from t5lite.data.loader import Loader
from t5lite.train import checkpoints, optimizers
from t5lite.train.partitioning import Partitioner
from t5lite.train.step import TrainTask
from t5lite.train.trainer import train

GLUE = str(shared_data_dir() / "glue")
LENGTHS = {"inputs": 32, "targets": 4}


def _params(model_dir, step):
    path = os.path.join(model_dir, "checkpoints", str(step), "state")
    return ocp.StandardCheckpointer().restore(path)["params"]


def _records(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _assert_same(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def save_params(run_dir, params, step=7):
    """A checkpoint laid out as a t5lite run's, holding just the params (all restore_params reads)."""
    ckpt = checkpoints.Checkpointer(os.path.join(run_dir, "checkpoints"), 1, async_save=False)
    ckpt.save(step, {"params": params}, {}, force=True)
    ckpt.close()


def test_finetuning_starts_from_the_checkpoint_and_evaluates(tmp_path, micro_config):
    module = models.build(micro_config)
    tokens = jnp.ones((1, 8), jnp.int32)
    # "Pre-trained" params: an init the trainer would never make itself (another seed).
    pretrained = nn.unbox(jax.jit(module.init)(jax.random.key(123), encoder_input_tokens=tokens,
                                               decoder_input_tokens=tokens))["params"]
    pre, ft = str(tmp_path / "pre"), str(tmp_path / "ft")
    save_params(pre, pretrained)
    # A zero learning rate: the fine-tuned step-1 parameters must be exactly the pre-trained ones.
    frozen = optax.constant_schedule(0.0)
    train(model_dir=ft, mixture_or_task_name="glue_sst2", task_feature_lengths=LENGTHS, train_steps=2, batch_size=4,
          model=micro_config, optimizer=(optimizers.adafactor(frozen), frozen), log_every=1, checkpoint_every=1,
          async_checkpoints=False, progress=False, data_dir=GLUE, initial_checkpoint_path=pre, eval_every=1,
          eval_max_examples=8)
    _assert_same(_params(ft, 1), pretrained)

    evals = [r for r in _records(ft) if "eval_accuracy" in r]
    assert [r["step"] for r in evals] == [1, 2]
    assert {"eval_loss", "eval_accuracy", "eval_score_accuracy"} <= set(evals[-1])
    with open(os.path.join(ft, "eval", "glue_sst2.validation", "predictions.jsonl")) as f:
        predictions = [json.loads(line) for line in f]
    assert len(predictions) == 8 and {"inputs", "target", "prediction", "score_prediction"} <= set(predictions[0])
    assert predictions[0]["inputs"].startswith("sst2 sentence:")
    assert {p["score_prediction"] for p in predictions} <= {"negative", "positive"}


@pytest.fixture
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_eval_and_infer_commands_name_missing_macros(clean_gin):
    from t5lite.infer.evaluation import evaluate
    config = "configs/local/t5_tiny_finetune_sst2.gin"
    with pytest.raises(ConfigError, match="CHECKPOINT_PATH"):
        cli.parse_gin([config], [], required_macros=(), entry=("eval", evaluate), base_file="gin/eval.gin")
    gin.clear_config()
    cli.parse_gin([config], ["CHECKPOINT_PATH = '/tmp/x'", "eval.split = 'validation'", "DATA_DIR = 'data/glue'"],
                  required_macros=(),
                  entry=("eval", evaluate), base_file="gin/eval.gin")
    assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "glue_sst2"
    gin.clear_config()
    with pytest.raises(ConfigError, match="INITIAL_CHECKPOINT_PATH"):
        cli.parse_gin([config], ["MODEL_DIR = '/tmp/x'"], entry=("train", train))


def _t5lite(*args, cwd=REPO):
    run = subprocess.run([sys.executable, "-m", "t5lite.cli", *args], capture_output=True, text=True, timeout=600,
                         cwd=cwd)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.mark.slow
def test_cli_pretrain_finetune_eval_infer(tmp_path):
    pre, ft = str(tmp_path / "pre"), str(tmp_path / "ft")
    _t5lite("train", "--gin_file=configs/local/t5_tiny_pretrain.gin", f"--gin.MODEL_DIR='{pre}'",
            "--gin.TRAIN_STEPS=2")
    _t5lite("train", "--gin_file=configs/local/t5_tiny_finetune_sst2.gin", f"--gin.MODEL_DIR='{ft}'",
            f"--gin.INITIAL_CHECKPOINT_PATH='{pre}'", f"--gin.DATA_DIR='{GLUE}'", "--gin.TRAIN_STEPS=2",
            "--gin.EVAL_EVERY=2", "--gin.train.eval_max_examples=16")
    assert any("eval_score_accuracy" in r for r in _records(ft))
    out = _t5lite("eval", "--gin_file=configs/local/t5_tiny_finetune_sst2.gin", f"--gin.CHECKPOINT_PATH='{ft}'",
                  f"--gin.eval.data_dir='{GLUE}'", "--gin.eval.max_examples=16")
    assert "score_accuracy=" in out
    out = _t5lite("infer", "--gin_file=configs/local/t5_tiny_finetune_sst2.gin", f"--gin.CHECKPOINT_PATH='{ft}'",
                  "sst2 sentence: a fine film .", "sst2 sentence: dull .")
    assert len([json.loads(line) for line in out.splitlines()]) == 2


def test_full_restore_continues_the_optimizer_like_an_uninterrupted_run(tmp_path, micro_config):
    """`initial_checkpoint_restore='full'` (T5X's fine-tuning): pre-train 2 steps, continue to step
    4 in a new run, and land exactly where 4 uninterrupted steps on the same batches land."""
    task, lengths = "embedded_docs_span_corruption", {"inputs": 32, "targets": 8}
    schedule = optimizers.rsqrt_decay(1.0, 100)
    args = dict(mixture_or_task_name=task, task_feature_lengths=lengths, batch_size=4, model=micro_config,
                optimizer=(optimizers.adafactor(schedule), schedule), log_every=1, checkpoint_every=100,
                async_checkpoints=False, progress=False)
    pre = str(tmp_path / "pre")
    train(model_dir=pre, train_steps=2, **args)
    for mode in ("full", "params"):
        train(model_dir=str(tmp_path / mode), train_steps=4, initial_checkpoint_path=pre,
              initial_checkpoint_restore=mode, **args)

    # The uninterrupted reference: one TrainTask, 4 steps; the new run's data starts over.
    loader = Loader(get_task(task), "train", lengths, 4)
    trainer = TrainTask(micro_config, optimizers.adafactor(schedule), schedule, Partitioner(),
                        loader.converter.model_feature_lengths(lengths, pack=True))
    first_two = [batch for batch, _ in zip(loader, range(2))]
    state, step = trainer.init_state(seed=0), trainer.jit_train_step()
    with trainer.mesh_context():
        for batch in first_two + first_two:
            state, _ = step(state, trainer.partitioner.shard_batch(batch))
    _assert_same(_params(str(tmp_path / "full"), 4), jax.device_get(state.params))
    assert [r["step"] for r in _records(str(tmp_path / "full"))] == [3, 4]
    # A fresh optimizer (the default) does not get there.
    differs = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(),
                           _params(str(tmp_path / "params"), 4), jax.device_get(state.params))
    assert max(jax.tree.leaves(differs)) > 1e-4


# T5X's fine-tuning settings, transcribed: t5x/configs/runs/finetune.gin (DROPOUT_RATE = 0.1;
# train/utils.DatasetConfig: pack = True; utils.create_learning_rate_scheduler: factors = 'constant',
# base_learning_rate = 0.001) and t5x/examples/t5/t5_1_1/base.gin (Z_LOSS = 0.0001).
T5X_FINETUNE = {"model_config.dropout_rate": 0.1, "train.pack": True, "optimizers.constant.learning_rate": 0.001,
                "train.z_loss": 0.0001}


def test_the_finetuning_gin_binds_t5xs_finetuning_settings():
    gin.clear_config()
    try:
        cli.parse_gin([str(REPO / "gin" / name) for name in ("train.gin", "models/t5_1_1_base.gin",
                                                             "optimizers/adafactor.gin", "objectives/finetune.gin")],
                      ["MODEL_DIR = '/tmp/x'", "INITIAL_CHECKPOINT_PATH = '/tmp/pt'", "EVAL_EVERY = 10",
                       "TRAIN_STEPS = 10", "BATCH_SIZE = 8", "MIXTURE_OR_TASK_NAME = 'glue_sst2'",
                       "TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 4}"])
        assert {name: gin.query_parameter(name) for name in T5X_FINETUNE} == T5X_FINETUNE
        assert gin.query_parameter("optimizer_and_schedule.schedule").selector == "optimizers.constant"
        assert gin.query_parameter("train.initial_checkpoint_restore") == "params"   # 'full' is T5X's restore
    finally:
        gin.clear_config()
