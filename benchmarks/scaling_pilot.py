"""An iso-FLOP scaling pilot on this machine: BERT-style encoders of several sizes, each pre-trained by
MLM on the embedded corpus for one FLOP budget (by default what a sweep's `cpu`-scale bert_tiny cell
spends: 5.12M tokens, 2500 steps of 32 x 64), then scored on the corpus' held-out split; a parabola
in log(parameters) through their held-out MLM losses (t5lite.experiments.scaling) puts the least
loss at the compute-optimal size for the budget. Every size shares bert_tiny's recipe (rate 2e-3,
30 warmup steps, cosine decay over its own steps); its steps are the budget over its FLOPs per step,
counted as the trainer counts them (checked against each run's log). Finished runs are reused.
    python benchmarks/scaling_pilot.py --out runs/scaling_pilot [--sizes L1_H32,L2_H64,...] [--seeds 0]
      [--budget_tokens 5120000 | --budget_flops 7e12] [--parallel 2]
Writes OUT/scaling.json and OUT/scaling.png and prints a table.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PRETRAIN = ["configs/local/bert_tiny_pretrain.gin", "gin/objectives/bert_mlm.gin"]
BATCH, ROW = 32, 64   # bert_tiny_pretrain.gin's batch and row length (the tiny presets' 64 positions)
REFERENCE = "L2_H64"   # bert_tiny: the size the sweeps' encoder cells use
# L layers of width H, 16-dim heads, d_ff 2H as bert_tiny (L2_H64) has them.
SIZES = {f"L{layers}_H{width}": {"num_encoder_layers": layers, "d_model": width, "num_heads": width // 16,
                                 "head_dim": 16, "d_ff": 2 * width}
         for layers, width in ((1, 32), (2, 64), (3, 96), (4, 128), (6, 192))}
FLOPS_LINE = re.compile(r"model \w+: [\d.]+M params; ([\d.e+-]+) FLOPs/step")
PARAMS_LINE = re.compile(r"\|\| all params: (\d+)")


def flops_per_step(size: str) -> float:
    """Model FLOPs of one training step of `size`, as the trainer counts them (TrainTask.flops_per_step:
    the batch times the MLM objective's FLOPs per 64-token packed row)."""
    from t5lite import models
    from t5lite.objectives.encoder import MlmObjective
    config = models.get_config("bert_tiny", vocab_size=2176, **SIZES[size])
    return BATCH * MlmObjective().train_flops_per_example(config, {"encoder_input_tokens": ROW})


def last_eval(run: Path, steps: int) -> float | None:
    """The held-out MLM loss a run logged at its last step; None before it gets there."""
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    done = [r["eval_mlm_loss"] for r in rows if r.get("step") == steps and "eval_mlm_loss" in r]
    return done[-1] if done else None


def train(size: str, seed: int, steps: int, out: Path) -> dict:
    """Pre-trains one size for `steps` (unless done) and returns its row."""
    run, log = out / f"{size}__seed{seed}", out / f"{size}__seed{seed}.log"
    if last_eval(run, steps) is None:
        overrides = json.dumps(SIZES[size]).replace('"', "'")
        with open(log, "a") as output:
            subprocess.run([sys.executable, "-m", "t5lite.cli", "train", *(f"--gin_file={f}" for f in PRETRAIN),
                            f"--gin.MODEL_DIR='{run}'", f"--gin.TRAIN_STEPS={steps}", f"--gin.train.seed={seed}",
                            f"--gin.model_config.overrides={overrides}", f"--gin.train.eval_every={steps}",
                            f"--gin.train.checkpoint_every={steps}"], stdout=output, stderr=subprocess.STDOUT, check=True)
    text, counted = log.read_text(), flops_per_step(size)
    logged = FLOPS_LINE.findall(text)[-1]   # the trainer's count, printed to 3 significant digits
    if f"{counted:.3g}" != logged:
        raise SystemExit(f"{size}: the trainer counts {logged} FLOPs/step, this pilot {counted:.3g}; "
                         "the budget would not be equal")
    cost = json.loads((run / "cost.json").read_text())
    return {"size": size, "seed": seed, "steps": steps, "params": int(PARAMS_LINE.findall(text)[-1]),
            "flops_per_step": counted, "tokens": steps * BATCH * ROW, "loss": last_eval(run, steps),
            "seconds": cost["seconds"]}


def main() -> None:
    from t5lite.experiments import scaling
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--seeds", default="0", help="comma-separated")
    parser.add_argument("--budget_tokens", type=float, default=5_120_000,
                        help=f"the budget as the tokens {REFERENCE} (bert_tiny) would read with it")
    parser.add_argument("--budget_flops", type=float, default=None, help="the budget in FLOPs (instead of tokens)")
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    sizes, seeds = args.sizes.split(","), [int(s) for s in args.seeds.split(",")]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown or len(sizes) < 3 or args.parallel < 1 or (args.budget_flops or args.budget_tokens) <= 0:
        raise SystemExit(f"--sizes {args.sizes} --parallel {args.parallel}: give 3 or more of {', '.join(SIZES)}, "
                         "--parallel >= 1 and a budget > 0")
    budget = args.budget_flops or args.budget_tokens // (BATCH * ROW) * flops_per_step(REFERENCE)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    jobs = [(size, seed, scaling.steps_for_budget(budget, flops_per_step(size))) for size in sizes for seed in seeds]
    with ThreadPoolExecutor(args.parallel) as pool:
        runs = list(pool.map(lambda job: train(*job, out), jobs))
    rows = [{"size": size, "params": next(r["params"] for r in runs if r["size"] == size),
             "losses": [r["loss"] for r in runs if r["size"] == size]} for size in sizes]
    fit = scaling.optimum([r["params"] for r in rows], [sum(r["losses"]) / len(r["losses"]) for r in rows])
    (out / "scaling.json").write_text(json.dumps({"budget_flops": budget, "batch": BATCH, "row": ROW, "runs": runs,
                                                  "fit": fit}, indent=1))
    scaling.plot(rows, fit, str(out / "scaling.png"),
                 f"BERT-style MLM on the embedded corpus, {budget:.3g} FLOPs each, seed(s) {args.seeds}")
    print("| size | parameters | steps | tokens | FLOPs/step | held-out MLM loss | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['size']} | {r['params']:,} | {r['steps']} | {r['tokens']:,} | {r['flops_per_step']:.3g} | "
              f"{r['loss']:.4f} | {r['seconds']:.0f} |")
    where = (f"least loss at {fit['best_params'] / 1e6:.3g}M parameters (loss {fit['best_loss']:.4f})" if fit["inside"]
             else "no minimum inside the sizes tried: the optimum lies beyond them")
    print(f"parabola in ln(parameters): {where}")
    print(f"wrote {out / 'scaling.json'} and {out / 'scaling.png'} ({(time.time() - started) / 60:.1f} min)")


if __name__ == "__main__":
    main()
