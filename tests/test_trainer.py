"""The train loop: resume equals an uninterrupted run, accumulation, losses, outputs, errors."""
import json
import os

import jax
import numpy as np
import optax
import pytest
from conftest import TINY_LENGTHS, TINY_TASK, logged_losses, train_tiny

from t5lite.train import checkpoints, optimizers
from t5lite.objectives import losses
from t5lite.train.partitioning import Partitioner
from t5lite.train.step import TrainTask
from t5lite.train.trainer import NonFiniteLossError

TASK, LENGTHS = TINY_TASK, TINY_LENGTHS


def _final_params(model_dir, step):
    ckpt = checkpoints.Checkpointer(os.path.join(model_dir, "checkpoints"), 1)
    import orbax.checkpoint as ocp
    restored = ckpt.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    ckpt.close()
    return restored.state["params"]


def test_resume_sees_the_same_batches_and_reaches_the_same_params(tmp_path, micro_config):
    config = micro_config.replace(dropout_rate=0.1)  # dropout: the RNG must be restored too
    train_tiny(tmp_path / "straight", config, 6)
    train_tiny(tmp_path / "resumed", config, 3)
    assert max(logged_losses(tmp_path / "resumed")) == 3
    train_tiny(tmp_path / "resumed", config, 6)
    straight, resumed = logged_losses(tmp_path / "straight"), logged_losses(tmp_path / "resumed")
    assert sorted(straight) == sorted(resumed) == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose([resumed[s] for s in range(1, 7)], [straight[s] for s in range(1, 7)], rtol=1e-6)
    a, b = _final_params(tmp_path / "straight", 6), _final_params(tmp_path / "resumed", 6)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
    for name in ("metrics.jsonl", "config.gin", "loss.png"):
        assert (tmp_path / "resumed" / name).exists()
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "resumed" / "tensorboard"))


def test_metrics_record_what_the_design_promises(tmp_path, micro_config):
    last = train_tiny(tmp_path, micro_config, 2)
    with open(tmp_path / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    for key in ("step", "loss", "learning_rate", "tokens_per_sec", "accuracy", "mfu", "real_tokens_per_sec",
                "examples_per_sec", "rows_per_sec", "padded_mfu"):
        assert key in records[-1]
    assert records[-1]["learning_rate"] == pytest.approx(0.1)  # 1 / sqrt(max(step, 100))
    # Real tokens are at most the padded ones (equal when nothing is padding: the two are computed
    # along different paths, so equal up to float rounding).
    assert 0 < last["mfu"] <= last["padded_mfu"] * (1 + 1e-9) and last["padded_mfu"] < 1
    assert 0 < last["real_tokens_per_sec"] <= last["tokens_per_sec"] * (1 + 1e-9)


def test_gradient_accumulation_matches_one_big_batch(tmp_path, micro_config):
    """With the whole-batch scope; T5X's per-microbatch one: tests/test_loss_normalization.py."""
    config = micro_config.replace(dropout_rate=0.0)
    one = train_tiny(tmp_path / "one", config, 2)
    two = train_tiny(tmp_path / "two", config, 2, num_microbatches=2, loss_normalizing_scope="global_batch")
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-5)
    assert one["grad_norm"] == pytest.approx(two["grad_norm"], rel=1e-4)


def test_microbatch_i_takes_every_mth_row(micro_config):
    """Strided microbatches (rows i, i + M, ...) keep every device's share of the batch local."""
    lengths = {"encoder_input_tokens": 4, "decoder_input_tokens": 4, "decoder_target_tokens": 4,
               "decoder_loss_weights": 4}
    schedule = optimizers.constant(1e-3)
    trainer = TrainTask(micro_config, optimizers.adafactor(schedule), schedule, Partitioner(), lengths,
                        num_microbatches=3)
    batch = np.arange(12 * 4).reshape(12, 4)
    with trainer.mesh_context():
        for i in range(3):
            np.testing.assert_array_equal(trainer._microbatch(batch, i), batch[[i, i + 3, i + 6, i + 9]])


def test_nan_loss_stops_with_a_clear_error(tmp_path, micro_config):
    schedule = optax.constant_schedule(1e30)
    sgd = optax.sgd(schedule)
    with pytest.raises(NonFiniteLossError, match="not finite, so not saved"):
        train_tiny(tmp_path, micro_config, 6, optimizer=(sgd, schedule))


def test_vocabulary_larger_than_embedding_is_rejected(tmp_path, micro_config):
    with pytest.raises(ValueError, match="vocabulary has 2100 ids"):
        train_tiny(tmp_path, micro_config.replace(vocab_size=1024), 1)


def test_a_decoder_ending_on_another_id_than_the_vocabulary_is_refused(tmp_path, micro_config):
    # The targets end with the vocabulary's </s> (id 1); a model stopping at id 5 would decode to the
    # maximum length every time.
    with pytest.raises(ValueError, match="ends every sequence with 1.*model_config.eos_token_id = 1"):
        train_tiny(tmp_path, micro_config.replace(eos_token_id=5), 1)
    assert not os.path.exists(os.path.join(tmp_path, "checkpoints"))


def _numpy_cross_entropy(logits, target, z_loss, smoothing):
    log_z = np.log(np.exp(logits - logits.max()).sum()) + logits.max()
    log_probs = logits - log_z
    v = len(logits)
    dist = np.full(v, smoothing / (v - 1))
    dist[target] = 1 - smoothing
    entropy = -(dist * np.log(np.where(dist > 0, dist, 1))).sum()
    return -(dist * log_probs).sum() - entropy + z_loss * log_z ** 2


@pytest.mark.parametrize("z_loss,smoothing", [(0.0, 0.0), (1e-4, 0.0), (0.0, 0.1), (1e-4, 0.2)])
def test_cross_entropy_matches_numpy(z_loss, smoothing):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 11)).astype(np.float32) * 3
    targets = rng.integers(0, 11, size=(2, 3))
    weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    loss, _ = losses.cross_entropy(logits, targets, weights, z_loss, smoothing)
    expected = np.array([[_numpy_cross_entropy(logits[b, t], targets[b, t], z_loss, smoothing) * weights[b, t]
                          for t in range(3)] for b in range(2)])
    np.testing.assert_allclose(np.asarray(loss), expected, rtol=1e-5, atol=1e-6)


def test_rsqrt_schedule_is_t5s():
    schedule = optimizers.rsqrt_decay()
    assert float(schedule(0)) == pytest.approx(0.01)
    assert float(schedule(10_000)) == pytest.approx(0.01)
    assert float(schedule(40_000)) == pytest.approx(0.005)


def test_bfloat16_scanned_rematerialised_model_trains_like_float32(tmp_path, micro_config):
    config = micro_config.replace(dropout_rate=0.0, scan_layers=True)  # scanned init differs from looped
    f32 = train_tiny(tmp_path / "f32", config, 3)
    fast = train_tiny(tmp_path / "bf16", config.replace(dtype="bfloat16", remat_policy="full"), 3)
    assert np.isfinite(fast["loss"])
    assert fast["loss"] == pytest.approx(f32["loss"], rel=0.02)
