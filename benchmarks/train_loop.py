"""What the training loop costs: `t5lite train` as a user runs it against its own bare jitted step.

For each gin config, alternating run by run:
- the loop: the real command (`python -m t5lite.cli train --gin_file=F ...`) in a subprocess, for
  `--steps` steps with a log every `--log_every`; its steady state is the median `steps_per_sec`
  of metrics.jsonl's log lines after the first (which holds the compile);
- the bare step: the same `t5lite.train.trainer.train()` call, from the same gin files and
  bindings, with its loop swapped for a timing loop that feeds one prepared batch to the run's own
  jitted step `--steps` times and waits for the result once.
The ratio loop / bare is what the input pipeline, host syncs, logging and checkpointing cost a
user; 1.0 means they are free. Evaluation is off on both sides (`train.eval_every = 0`).

    python benchmarks/train_loop.py --configs configs/local/t5_tiny_pretrain.gin configs/local/gpt2_tiny_pretrain.gin
    python benchmarks/train_loop.py --configs configs/local/bert_tiny_finetune_sst2.gin \
        --gin "DATA_DIR='data/glue'" --gin "INITIAL_CHECKPOINT_PATH='runs/bert_tiny_mlm'"
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

os.environ.setdefault("JAX_PLATFORMS", "cpu")   # before JAX initialises, as `t5lite train` on this machine

import jax  # noqa: E402

from t5lite import finite  # noqa: E402
from t5lite.errors import T5liteError  # noqa: E402
from t5lite.cli.gin_flags import parse_gin  # noqa: E402
from t5lite.cli.inputs import positive_int  # noqa: E402
from t5lite.train import trainer  # noqa: E402

EVAL_EVERY_MACRO = re.compile(r"^EVAL_EVERY\s*=", re.M)
DEFAULT_CONFIGS = ["configs/local/t5_tiny_pretrain.gin", "configs/local/bert_tiny_pretrain.gin",
                   "configs/local/gpt2_tiny_pretrain.gin"]


def no_evaluation(config: str) -> str:
    """The binding that turns evaluation off: the EVAL_EVERY macro where the config sets it (as the
    fine-tuning configs do; binding train.eval_every would leave it unused, which t5lite refuses),
    else train.eval_every."""
    return "EVAL_EVERY = 0" if EVAL_EVERY_MACRO.search(Path(config).read_text()) else "train.eval_every = 0"


def run_bindings(config: str, model_dir: str, steps: int, log_every: int, extra: list[str]) -> list[str]:
    """The gin bindings both sides use: the user's, then a fresh MODEL_DIR, the step count, the
    logging interval and no evaluation."""
    return [*extra, f"MODEL_DIR = '{model_dir}'", f"TRAIN_STEPS = {steps}", f"train.log_every = {log_every}",
            no_evaluation(config)]


def loop_steps_per_sec(config: str, bindings: list[str], model_dir: str) -> float:
    """Steady-state steps/s of the real command: the median over metrics.jsonl's log lines after the
    first (the first step's line includes the compile)."""
    command = [sys.executable, "-m", "t5lite.cli", "train", f"--gin_file={config}",
               *(f"--gin.{b.replace(' = ', '=', 1)}" for b in bindings)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"{' '.join(command)} failed with exit {done.returncode}: {last}")
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    rates = [line["steps_per_sec"] for line in lines if "steps_per_sec" in line][1:]
    if not rates:
        raise SystemExit(f"{config}: no log line after the first; raise --steps or lower --log_every")
    return statistics.median(rates)


class BareStep:
    """The run `train()` builds from the parsed gin config, stopped before its loop: its jitted step
    is then timed on one batch from its own input pipeline."""

    def __init__(self, config: str, bindings: list[str]):
        parse_gin([config], bindings, entry=("train", trainer.train))
        holder = {}
        with mock.patch.object(trainer, "loop", lambda run, stop, progress=True: holder.update(run=run) or {}):
            trainer.train(progress=False)
        self.run = holder["run"]
        batch, _ = next(self.run.batches)
        self.batch = self.run.trainer.partitioner.shard_batch(batch)
        self.state = self.run.state
        self.steps_per_sec(2)   # compile and warm up

    def steps_per_sec(self, steps: int) -> float:
        with self.run.trainer.mesh_context():
            start = time.perf_counter()
            for _ in range(steps):
                self.state, metrics = self.run.step(self.state, self.batch)
            jax.block_until_ready(metrics)
            return steps / (time.perf_counter() - start)

    def close(self):
        self.run.batches.close()
        self.run.checkpointer.close()
        self.run.writer.close()


def measure(config: str, extra: list[str], steps: int, log_every: int, runs: int, work_dir: str) -> dict:
    """Loop and bare steps/s of one config, `runs` of each, alternating."""
    import gin
    gin.clear_config()
    bare = BareStep(config, run_bindings(config, os.path.join(work_dir, "bare"), steps, log_every, extra))
    loop, step = [], []
    try:
        for i in range(runs):
            model_dir = os.path.join(work_dir, f"loop{i}")
            loop.append(loop_steps_per_sec(config, run_bindings(config, model_dir, steps, log_every, extra), model_dir))
            step.append(bare.steps_per_sec(steps))
    finally:
        bare.close()
    return {"config": config, "loop_steps_per_sec": loop, "bare_steps_per_sec": step,
            "ratio": statistics.median(loop) / statistics.median(step)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, metavar="GIN_FILE")
    parser.add_argument("--gin", action="append", default=[], metavar="BINDING",
                        help="a gin binding for every config, e.g. \"DATA_DIR='data/glue'\" (repeatable)")
    parser.add_argument("--steps", type=positive_int, default=60, help="steps per run on each side")
    parser.add_argument("--log_every", type=positive_int, default=10, help="the command's logging interval")
    parser.add_argument("--runs", type=positive_int, default=3, help="alternating runs of each side")
    parser.add_argument("--out", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.steps < 2 * args.log_every:
        parser.error(f"--steps {args.steps} gives no steady-state log line; use at least 2 x --log_every")
    rows = []
    print(f"{jax.devices()[0].device_kind}; median of {args.runs} alternating runs x {args.steps} steps")
    print(f"{'config':44s} {'loop steps/s':>12s} {'bare steps/s':>12s} {'loop / bare':>11s}")
    for config in args.configs:
        with tempfile.TemporaryDirectory() as work_dir:
            try:
                row = measure(config, args.gin, args.steps, args.log_every, args.runs, work_dir)
            except T5liteError as e:   # a bad config or binding: one line, as `t5lite train` gives it
                print(f"{config}: {e}", file=sys.stderr)
                raise SystemExit(2) from None
        rows.append(row)
        print(f"{config:44s} {statistics.median(row['loop_steps_per_sec']):12.2f} "
              f"{statistics.median(row['bare_steps_per_sec']):12.2f} {row['ratio']:11.2f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            finite.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
