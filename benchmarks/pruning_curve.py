"""Accuracy vs sparsity of iterative magnitude pruning, with and without lottery-ticket rewinding
(docs/guides/compression.md).

A small T5 trained on GLUE SST-2 (text-to-text) for `--steps`; then `--rounds` rounds, each
pruning 20% of the remaining dense-kernel weights globally (open_lth's rule) and training
`--steps` again: from the previous round's trained weights ("no rewinding", pruning then
fine-tuning) or from the dense run's weights at step `--rewind_step` ("rewinding", Frankle et
al.). Each run is `t5lite.train.trainer.train` with `pruning=MagnitudePruning(...)`; dev accuracy is
free-decoding accuracy on `--eval_examples` dev examples. Writes `--out/pruning_curve.json` and
`--out/pruning_curve.png`, and prints a markdown table.
    python benchmarks/pruning_curve.py --glue_dir data/glue --out /tmp/pruning
"""
from __future__ import annotations

import argparse
import json
import os

from t5lite import finite


def _train(model_dir, args, initial=None, pruning=None, checkpoint_every=None):
    from t5lite import models
    from t5lite.train import optimizers
    from t5lite.train.trainer import train
    if os.path.exists(os.path.join(model_dir, "metrics.jsonl")):
        return _accuracy(model_dir)
    config = models.get_config("t5_tiny", d_model=64, num_heads=4, head_dim=16, d_ff=128, num_encoder_layers=2,
                               num_decoder_layers=2, dropout_rate=0.0)
    schedule = optimizers.constant(args.learning_rate)
    train(model_dir=model_dir, mixture_or_task_name="glue_sst2", task_feature_lengths={"inputs": 64, "targets": 4},
          batch_size=32, train_steps=args.steps, model=config, optimizer=(optimizers.adafactor(schedule), schedule),
          data_dir=args.glue_dir, initial_checkpoint_path=initial, pruning=pruning, log_every=args.steps,
          checkpoint_every=checkpoint_every or args.steps, keep_checkpoints=100, eval_every=args.steps,
          eval_max_examples=args.eval_examples, eval_batch_size=64, progress=False)
    return _accuracy(model_dir)


def _accuracy(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        last = [json.loads(line) for line in f][-1]
    return next(v for k, v in last.items() if k.startswith("eval_") and k.endswith("accuracy"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--glue_dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rewind_step", type=int, default=10)
    parser.add_argument("--learning_rate", type=float, default=1e-2)
    parser.add_argument("--eval_examples", type=int, default=872)
    args = parser.parse_args()
    from t5lite.train.pruning import MagnitudePruning
    dense = os.path.join(args.out, "dense")
    rows = [{"round": 0, "sparsity": 0.0, "no_rewind": _train(dense, args, checkpoint_every=args.rewind_step)}]
    rows[0]["rewind"] = rows[0]["no_rewind"]
    previous = {"no_rewind": dense, "rewind": dense}
    for r in range(1, args.rounds + 1):
        row = {"round": r}
        for variant in ("no_rewind", "rewind"):
            rewind = os.path.join(dense, "checkpoints", str(args.rewind_step)) if variant == "rewind" else None
            run = os.path.join(args.out, f"{variant}_{r}")
            row[variant] = _train(run, args, initial=previous[variant],
                                  pruning=MagnitudePruning(fraction=0.2, scope="global", rewind_checkpoint=rewind))
            with open(os.path.join(run, "sparsity.json")) as f:
                row["sparsity"] = json.load(f)["total"]
            previous[variant] = run
        rows.append(row)
        print(row, flush=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("glue_dir", "out")}   # not this machine's paths
    with open(os.path.join(args.out, "pruning_curve.json"), "w") as f:
        finite.dump({"args": settings, "rows": rows}, f, indent=1)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    x = [100 * r["sparsity"] for r in rows]
    ax.plot(x, [r["no_rewind"] for r in rows], "o-", label="prune + fine-tune (no rewinding)")
    ax.plot(x, [r["rewind"] for r in rows], "s-", label=f"rewind to step {args.rewind_step}")
    ax.set_xlabel("sparsity of the dense kernels (%)")
    ax.set_ylabel("SST-2 dev accuracy (%)")
    ax.set_title("Iterative magnitude pruning, 20% per round")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "pruning_curve.png"), dpi=120)
    print("| round | sparsity % | no rewinding | rewinding |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['round']} | {100 * r['sparsity']:.1f} | {r['no_rewind']:.2f} | {r['rewind']:.2f} |")


if __name__ == "__main__":
    main()
