"""XLA compile time and peak host memory of the train step against depth, looped vs scanned layers.

Each point runs in a fresh subprocess (no compilation cache) that builds a t5_1_1_tiny-width
encoder-decoder with N encoder and N decoder layers on the CPU, lowers and compiles
`TrainTask.jit_train_step()` from shapes, and reports the compile seconds and its peak resident
memory (`resource.getrusage` maxrss). With `scan_layers` the step holds one layer body whatever
the depth, so its compile time should stay nearly flat.
    python benchmarks/compile_time.py [--depths 2,8,24]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

POINT = """
import json, resource, time
import jax, jax.numpy as jnp
from t5lite.models import get_config
from t5lite.train import optimizers
from t5lite.train.partitioning import Partitioner
from t5lite.train.step import TrainTask
depth, scan = {depth}, {scan}
cfg = get_config("t5_1_1_tiny", num_encoder_layers=depth, num_decoder_layers=depth, scan_layers=scan)
lengths = dict(encoder_input_tokens=64, decoder_input_tokens=16, decoder_target_tokens=16, decoder_loss_weights=16)
schedule = optimizers.constant(1e-3)
partitioner = Partitioner()
task = TrainTask(cfg, optimizers.adafactor(schedule), schedule, partitioner, lengths)
batch = {{k: jax.ShapeDtypeStruct((8, n), jnp.int32, sharding=partitioner.batch_sharding()) for k, n in lengths.items()}}
start = time.perf_counter()
with task.mesh_context():
    task.jit_train_step().lower(task.abstract_state, batch).compile()
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def measure(depth: int, scan: bool) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_COMPILATION_CACHE="false")
    out = subprocess.run([sys.executable, "-c", POINT.format(depth=depth, scan=scan)], capture_output=True,
                         text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="2,8,24", help="comma-separated layers per stack, e.g. 2,8,24,48")
    args = parser.parse_args()
    print(f"{'layers':>6} | {'looped s':>9} | {'looped MiB':>10} | {'scanned s':>9} | {'scanned MiB':>11}")
    for depth in (int(d) for d in args.depths.split(",")):
        looped, scanned = measure(depth, False), measure(depth, True)
        print(f"{depth:>6} | {looped['seconds']:>9.1f} | {looped['maxrss_mib']:>10.0f} | "
              f"{scanned['seconds']:>9.1f} | {scanned['maxrss_mib']:>11.0f}", flush=True)


if __name__ == "__main__":
    main()
