"""Runs a few train steps on a CPU mesh, for tests/test_partitioning.py (one process per host;
the test imports `run` and `host_batches` to train its single-device reference in-process).

Usage: python sharding_worker.py MODE OUT_JSON [PROCESS_ID NUM_PROCESSES PORT LAYOUT]
MODE "mesh": 8 devices, mesh (2, 2, 2) vs a single device; writes both runs' losses.
MODE "multihost": this process is one of NUM_PROCESSES hosts with 2 devices each, the mesh laid
out by LAYOUT (`layout_devices`); writes the losses and the global batches the hosts built.
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
from t5lite.train.step import TrainTask  # noqa: E402

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


def layout_devices(layout, devices):
    """(mesh shape, device order) over hosts p = 0..P-1 with devices (p, 0) and (p, 1):
    "interleaved": data-parallel rows (p=0 d0, p=1 d0, ..., p=0 d1, p=1 d1, ...), so each host's
    rows are not adjacent; "ring": P data rows of 2 model-parallel devices, row r on hosts r and
    r + 1 (mod P), so every host shares rows with two others."""
    by_host = sorted(devices, key=lambda d: (d.process_index, d.id))
    hosts = len(by_host) // 2
    if layout == "interleaved":
        return (-1, 1, 1), by_host[0::2] + by_host[1::2]
    return (hosts, 1, 2), [by_host[2 * ((r + k) % hosts) + k] for r in range(hosts) for k in range(2)]


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
        process_id, num_processes, port = map(int, multihost[:3])
        layout = multihost[3]
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                                   process_id=process_id)
        from jax.experimental import multihost_utils
        mesh_shape, devices = layout_devices(layout, jax.devices())
        partitioner = Partitioner(mesh_shape, devices=devices)
        shard = partitioner.data_shard()
        batches = host_batches(*shard)
        result["losses"], result["layout"] = run(partitioner, batches)
        result["global"] = [np.asarray(multihost_utils.process_allgather(
            partitioner.shard_batch(b)["encoder_input_tokens"], tiled=True)).tolist() for b in batches]
        result["shard"], result["process_count"] = list(shard), jax.process_count()
        result["device_count"] = jax.device_count()
    else:
        for mesh_shape in ((8, 1, 1), (4, 1, 2)):
            result[str(mesh_shape)] = {m: count_collectives(mesh_shape, m) for m in (1, 4)}
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
