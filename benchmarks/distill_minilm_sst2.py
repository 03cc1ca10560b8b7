"""A 3-layer MiniLM student on SST-2, distilled from a fine-tuned all-MiniLM-L6-v2 vs trained alone.

Both students start from layers [0, 2, 4] of the pre-trained model (`--init`) and train with
configs/local/minilm_distill_sst2.gin, the distilled one against `--teacher`, the other with
TEACHER_PATH=None. They run alternately in chunks of `--chunk` steps (each resuming its run), so
both see the machine in the same state; s/step is the median over the logged windows, leaving out
each chunk's first one (compilation). Prints and writes OUT/compare.json: dev accuracy after every
chunk, parameters, s/step and each run's cost.json.
    python benchmarks/distill_minilm_sst2.py --init runs/minilm --teacher runs/minilm_sst2 \
        --data_dir data/glue --out runs/distill [--steps 300] [--chunk 100]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--init", "--teacher", "--data_dir", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--chunk", type=int, default=100)
    args = parser.parse_args()
    base = [sys.executable, "-m", "t5lite.cli", "train", "--gin_file=configs/local/minilm_distill_sst2.gin",
            f"--gin.INITIAL_CHECKPOINT_PATH='{args.init}'", f"--gin.DATA_DIR='{args.data_dir}'",
            f"--gin.warmup_cosine.decay_steps={args.steps}", f"--gin.EVAL_EVERY={args.steps}"]
    runs = {"distilled": f"--gin.TEACHER_PATH='{args.teacher}'", "alone": "--gin.TEACHER_PATH=None"}
    os.makedirs(args.out, exist_ok=True)
    for end in range(args.chunk, args.steps + 1, args.chunk):
        for name, teacher in runs.items():
            with open(os.path.join(args.out, f"{name}.log"), "a") as log:
                subprocess.run(base + [teacher, f"--gin.MODEL_DIR='{os.path.join(args.out, name)}'",
                                       f"--gin.TRAIN_STEPS={end}"], check=True, stdout=log, stderr=subprocess.STDOUT)
    first_windows = {start + 1 for start in range(0, args.steps, args.chunk)}
    report = {}
    for name in runs:
        run = os.path.join(args.out, name)
        records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
        seconds = [1 / r["steps_per_sec"] for r in records if "steps_per_sec" in r and r["step"] not in first_windows]
        report[name] = {"dev_accuracy": {r["step"]: r["eval_accuracy"] for r in records if "eval_accuracy" in r},
                        "teacher_dev_accuracy": next((r["teacher_eval_accuracy"] for r in records
                                                      if "teacher_eval_accuracy" in r), None),
                        "s_per_step_median": statistics.median(seconds),
                        "cost": json.load(open(os.path.join(run, "cost.json")))}
    with open(os.path.join(args.out, "compare.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
