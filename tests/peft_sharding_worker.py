"""LoRA on a 4-device CPU mesh (FSDP x tensor parallel) against one device, for tests/test_peft.py;
exits non-zero if they differ.

Usage: python peft_sharding_worker.py train       train steps (scanned layers, 2 microbatches)
       python peft_sharding_worker.py infer RUN   a LoRA run's params read for inference
"""
import os
import sys

if __name__ == "__main__":   # the device count is fixed when JAX starts: before importing it
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from t5lite.infer import predict  # noqa: E402
from t5lite.models import get_config, peft  # noqa: E402
from t5lite.train import optimizers  # noqa: E402
from t5lite.train.partitioning import Partitioner  # noqa: E402
from t5lite.train.step import TrainTask  # noqa: E402

LENGTHS = {"encoder_input_tokens": 8, "decoder_input_tokens": 8, "decoder_target_tokens": 8,
           "decoder_loss_weights": 8}


def run(partitioner):
    config = get_config("t5_tiny", d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=2,
                        num_decoder_layers=2, vocab_size=256, scan_layers=True)
    schedule = optax.constant_schedule(1e-2)
    task = TrainTask(config, optimizers.adafactor(schedule), schedule, partitioner, LENGTHS, num_microbatches=2,
                     peft=peft.LoRA(r=4, target_modules=("query", "value", "wi", "wo")))
    frozen = task.init_base(0, None)
    state = task.init_state(0, frozen)
    step = task.jit_train_step(frozen)
    rng = np.random.RandomState(0)
    batch = {k: rng.randint(1, 200, (4, 8)).astype(np.int32) for k in LENGTHS}
    batch["decoder_loss_weights"] = np.ones((4, 8), np.int32)
    with task.mesh_context():
        for _ in range(3):
            state, _ = step(state, partitioner.shard_batch(batch))
    spec = state.params["lora"]["encoder"]["layers"]["mlp"]["wi"]["lora_b"].sharding.spec
    return jax.tree.map(np.asarray, state.params), spec


def train():
    sharded, spec = run(Partitioner(mesh_shape=(1, 2, 2)))
    assert "model" in tuple(spec), spec      # LoRA's B of an MLP kernel is sharded over `model`, like the kernel
    single, _ = run(Partitioner(mesh_shape=(1, 1, 1), devices=jax.devices()[:1]))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), sharded, single)


def infer(run_dir):
    """The base laid out over the mesh, the LoRA update merged into it in place."""
    config = predict.model_config_of(run_dir, None)
    sharded, _, _ = predict.load_params(config, run_dir, Partitioner(mesh_shape=(1, 2, 2)))
    single, _, _ = predict.load_params(config, run_dir)
    kernel = sharded["encoder"]["layers_0"]["self_attention"]["query"]["kernel"]
    assert len(kernel.sharding.device_set) == 4, kernel.sharding
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6), sharded, single)


if __name__ == "__main__":
    {"train": train, "infer": infer}[sys.argv[1]](*sys.argv[2:])
    print("ok")
