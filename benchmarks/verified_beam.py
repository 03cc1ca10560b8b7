"""Accuracy against beam size with verification (Lample & Charton's evaluation): for each beam
size, the share of held-out questions whose beam holds a hypothesis the task's verifier accepts
(t5lite.infer.verified). Prints a table; writes `verified_beam.json` and `verified_beam.png`.
    python benchmarks/verified_beam.py --checkpoint runs/integration --task symbolic_integration --out runs/integration/beam
"""
from __future__ import annotations

import argparse
import json
import os
import time


def plot(task: str, accuracy: dict[int, float], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    sizes = sorted(accuracy)
    ax.plot(sizes, [accuracy[k] for k in sizes], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(k) for k in sizes])
    ax.set_xlabel("beam size")
    ax.set_ylabel("verified accuracy (%)")
    ax.set_title(f"{task}: beam search with verification")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a t5lite run trained on --task (or one of its steps)")
    parser.add_argument("--task", default="symbolic_integration",
                        help="symbolic_derivative, symbolic_integration or bytecode_to_source")
    parser.add_argument("--beam_sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--max_examples", type=int, default=None, help="default: the whole validation split")
    parser.add_argument("--length", type=int, default=48, help="input and target length, as the run's TASK_FEATURE_LENGTHS")
    parser.add_argument("--out", required=True, help="folder for verified_beam.json and verified_beam.png")
    args = parser.parse_args()

    from t5lite import models
    from t5lite.data import get_task
    from t5lite.data.tasks.symbolic import VERIFIERS
    from t5lite.infer import predict, verified
    from t5lite.infer.evaluation import Evaluator

    if args.task not in VERIFIERS:
        parser.error(f"--task={args.task}: expected one of {sorted(VERIFIERS)}")
    task = get_task(args.task)
    config = predict.model_config_of(args.checkpoint, None)
    module = models.build(config)
    params, step, _ = predict.load_params(config, args.checkpoint, vocabulary=task.output_features["targets"].vocabulary)
    evaluator = Evaluator(task, "validation", {"inputs": args.length, "targets": args.length},
                          max_examples=args.max_examples, rank_classification=False)
    accuracy = {}
    print(f"{args.task}, step {step}, {len(evaluator.examples)} questions")
    print("beam  verified accuracy  seconds")
    for k in args.beam_sizes:
        start = time.perf_counter()
        accuracy[k] = verified.verified_beam(module, params, evaluator, VERIFIERS[args.task], k).accuracy
        print(f"{k:>4}  {accuracy[k]:>16.1f}  {time.perf_counter() - start:>7.1f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "verified_beam.json"), "w") as f:
        json.dump({"task": args.task, "step": step, "questions": len(evaluator.examples),
                   "accuracy_by_beam_size": accuracy}, f, indent=1)
    plot(args.task, accuracy, os.path.join(args.out, "verified_beam.png"))


if __name__ == "__main__":
    main()
