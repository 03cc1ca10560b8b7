"""The decoder and encoder-decoder pre-training configs run as shipped (at reduced sizes): the loss
is finite and falls, the run records its vocabulary and resumes (fast: one byte-level BPE config
resumes, since resuming is the trainer's whatever the config; slow: every config)."""
import json
import math
import os

import gin
import pytest

from conftest import REPO, logged_losses
from t5lite import cli

# Reduced sizes and, for AdamW's configs, no warmup, so that a handful of steps shows learning.
CONFIGS = {
    "gpt2_tiny_pretrain": ("byte_bpe", ["TASK_FEATURE_LENGTHS = {'targets': 32}", "warmup_cosine.warmup_steps = 1",
                                        "warmup_cosine.peak_learning_rate = 1e-2"]),
    "bart_tiny_pretrain": ("byte_bpe", ["TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 32}",
                                        "warmup_cosine.warmup_steps = 1", "warmup_cosine.peak_learning_rate = 1e-2"]),
    "t5_prefix_lm_tiny_pretrain": ("sentencepiece", ["TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 32}"]),
}
RESUMED = "gpt2_tiny_pretrain"   # byte-level BPE: the resumed run finds its recorded vocabulary


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _train(name, model_dir, steps, bindings):
    cwd = os.getcwd()
    os.chdir(REPO)   # the configs include gin/ pieces by paths relative to the repository
    try:
        cli.main(["train", f"--gin_file=configs/local/{name}.gin", f"--gin.MODEL_DIR='{model_dir}'",
                  f"--gin.TRAIN_STEPS={steps}", "--gin.BATCH_SIZE=8", "--gin.train.log_every=1",
                  "--gin.train.checkpoint_every=4",
                  *(f"--gin.{b}" for b in bindings)])
    finally:
        os.chdir(cwd)
        gin.clear_config()


def _pretrain_8_steps(name, model_dir):
    kind, bindings = CONFIGS[name]
    _train(name, model_dir, 8, bindings)
    losses = logged_losses(model_dir)
    assert sorted(losses) == list(range(1, 9)) and all(math.isfinite(v) for v in losses.values())
    assert (losses[7] + losses[8]) / 2 < losses[1] - 0.1, losses
    assert json.loads((model_dir / "vocabulary.json").read_text())["kind"] == kind


@pytest.mark.parametrize("name", sorted(set(CONFIGS) - {RESUMED}))
def test_config_pretrains_and_records_its_vocabulary(tmp_path, name):
    _pretrain_8_steps(name, tmp_path)


@pytest.mark.parametrize("name", [name if name == RESUMED else pytest.param(name, marks=pytest.mark.slow)
                                  for name in sorted(CONFIGS)])
def test_config_pretrains_and_resumes(tmp_path, name):
    _pretrain_8_steps(name, tmp_path)
    _train(name, tmp_path, 10, CONFIGS[name][1])   # a second run resumes from step 8
    assert sorted(logged_losses(tmp_path)) == list(range(1, 11))


@pytest.mark.parametrize("preset,kind", [("gpt2_tiny", "byte_bpe"), ("gpt2_tiny", "sentencepiece"),
                                         ("bart_tiny", "byte_bpe"), ("bart_tiny", "sentencepiece")])
def test_tiny_decoders_start_and_stop_on_the_tiny_vocabularies_end_of_sequence(preset, kind):
    # GPT-2 starts and stops on its <|endoftext|>, BART on </s>: the tiny presets do the same with the
    # id the vocabulary itself ends sequences with, so `infer` stops where the training targets ended.
    from t5lite.data import vocab
    from t5lite.models.config import get_config
    eos = vocab.resolved(vocab.make_vocabulary(kind)).eos_id
    config = get_config(preset)
    assert (config.eos_token_id, config.decoder_start_token_id) == (eos, eos)
