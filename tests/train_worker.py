"""One host of a 2-process training run on CPU, for tests/test_run_safety.py.

Usage: python train_worker.py PROCESS_ID NUM_PROCESSES PORT MODEL_DIR TRAIN_STEPS TASK DATA_DIR
Trains the micro T5 of conftest.py on TASK with `train()`, resuming from MODEL_DIR.
"""
import os
import sys

# Added to the flags conftest.py gives every process (-O0).
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

process_id, num_processes, port = map(int, sys.argv[1:4])
model_dir, train_steps, task, data_dir = sys.argv[4], int(sys.argv[5]), sys.argv[6], sys.argv[7]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                           process_id=process_id)

from t5lite.models import get_config  # noqa: E402
from t5lite.train import optimizers  # noqa: E402
from t5lite.train.trainer import train  # noqa: E402

config = get_config("t5_tiny", d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=1,
                    num_decoder_layers=1, vocab_size=2176)
schedule = optimizers.rsqrt_decay(1.0, 100)
train(model_dir=model_dir, mixture_or_task_name=task, data_dir=data_dir,
      task_feature_lengths={"inputs": 64, "targets": 8}, batch_size=4, train_steps=train_steps, model=config,
      optimizer=(optimizers.adafactor(schedule), schedule), log_every=1, checkpoint_every=2, progress=False)
