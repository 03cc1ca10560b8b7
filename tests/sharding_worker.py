"""Runs a few train steps on a CPU mesh, for tests/test_partitioning.py (one process per host;
the test imports `run` and `host_batches` to train its single-device reference in-process).

Usage: python sharding_worker.py MODE OUT_JSON [PROCESS_ID NUM_PROCESSES PORT]
MODE "mesh": 8 devices, mesh (2, 2, 2) vs a single device; writes both runs' losses.
MODE "multihost": this process is one of NUM_PROCESSES hosts with 2 devices each.
MODE "collectives": 8 devices; counts the data-moving collectives in the compiled train step
per mesh shape and number of microbatches.
"""
import json
import os
import re
import sys

if __name__ == "__main__":   # the device count is fixed when JAX starts: before importing it
    devices_per_process = {"mesh": 8, "multihost": 2, "collectives": 8}[sys.argv[1]]
    # Added to the flags conftest.py gives every process (-O0).
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={devices_per_process}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from t5lite.data import get_task  # noqa: E402
from t5lite.data.loader import Loader  # noqa: E402
from t5lite.models import get_config  # noqa: E402
from t5lite.train import optimizers  # noqa: E402
from t5lite.train.partitioning import Partitioner  # noqa: E402
from t5lite.train.trainer import TrainTask  # noqa: E402

LENGTHS = {"inputs": 32, "targets": 8}
BATCH = 8
STEPS = 3
config = get_config("t5_tiny", d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=1,
                    num_decoder_layers=1, dropout_rate=0.0)
task = get_task("embedded_docs_span_corruption")


def run(partitioner, batches):
    schedule = optimizers.rsqrt_decay(1.0, 100)
    trainer = TrainTask(config, optimizers.adafactor(schedule), schedule, partitioner,
                        Loader(task, "train", LENGTHS, BATCH).converter.model_feature_lengths(LENGTHS, pack=True))
    state = trainer.init_state(seed=0)
    step = trainer.jit_train_step()
    losses = []
    with trainer.mesh_context():
        for batch in batches:
            state, metrics = step(state, partitioner.shard_batch(batch))
            losses.append(float(metrics["loss"]))
    # The encoder's first MLP input kernel, logical axes (embed, mlp), wherever the model nests it.
    wi = next(leaf for path, leaf in jax.tree_util.tree_leaves_with_path(state.params)
              if "encoder" in jax.tree_util.keystr(path) and "'wi" in jax.tree_util.keystr(path))
    return losses, {"wi_spec": list(map(str, wi.sharding.spec)), "num_devices": len(wi.sharding.device_set)}


def count_collectives(mesh_shape, num_microbatches, batch_size=32):
    """How often each resharding collective occurs in the compiled step's HLO text."""
    partitioner = Partitioner(mesh_shape)
    schedule = optimizers.rsqrt_decay(1.0, 100)
    lengths = Loader(task, "train", LENGTHS, BATCH).converter.model_feature_lengths(LENGTHS, pack=True)
    trainer = TrainTask(config, optimizers.adafactor(schedule), schedule, partitioner, lengths,
                        num_microbatches=num_microbatches)
    batch = {k: jax.ShapeDtypeStruct((batch_size, n), np.int32, sharding=partitioner.batch_sharding())
             for k, n in lengths.items()}
    with trainer.mesh_context():
        hlo = trainer.jit_train_step().lower(trainer.abstract_state, batch).compile().as_text()
    ops = ("all-gather", "all-to-all", "collective-permute")
    return {op: len(re.findall(rf"\s{op}(?:-start)?\(", hlo)) for op in ops}


def host_batches(process_index, process_count):
    loader = Loader(task, "train", LENGTHS, BATCH, shard_index=process_index, shard_count=process_count)
    it = iter(loader)
    return [next(it) for _ in range(STEPS)]


def main(mode, out_path, *multihost):
    result = {}
    if mode == "mesh":
        batches = host_batches(0, 1)
        result["sharded"], result["sharded_layout"] = run(Partitioner((2, 2, 2)), batches)
        result["single"], _ = run(Partitioner((1, 1, 1), devices=jax.devices()[:1]), batches)
    elif mode == "multihost":
        process_id, num_processes, port = map(int, multihost)
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                                   process_id=process_id)
        batches = host_batches(jax.process_index(), jax.process_count())
        result["losses"], result["layout"] = run(Partitioner((-1, 1, 1)), batches)
        result["process_count"], result["device_count"] = jax.process_count(), jax.device_count()
    else:
        for mesh_shape in ((8, 1, 1), (4, 1, 2)):
            result[str(mesh_shape)] = {m: count_collectives(mesh_shape, m) for m in (1, 4)}
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
