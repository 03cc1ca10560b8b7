"""The forgetting frontier of one bert_tiny MLM base fine-tuned on GLUE SST-2 five ways: full
fine-tuning at the config's rate (1e-3) and at a tenth of it, ULMFiT's discriminative rates with
gradual unfreezing (gin/optimizers/ulmfit.gin), LoRA (gin/peft/lora.gin) and Houlsby adapters
(gin/peft/houlsby.gin). Each run is a `t5lite train` from the base, then `t5lite eval --forgetting`
on the base's held-out MLM split; the table and the plot put the MLM loss increase (forgetting)
against SST-2 dev accuracy (fit). With `--ud`, a second lens: `t5lite probe`'s POS probe on the base and
on each run (UD English-EWT), the change of its accuracy at the last layer. Finished runs and probes
are reused; a rerun only adds what is missing.
    python benchmarks/forgetting.py --base runs/bert_tiny_mlm --data_dir data/glue --out runs/forgetting \
      [--steps 200] [--seeds 0] [--eval_examples 256] [--methods full,full_low,ulmfit,lora,adapters] [--ud data/ud] \
      [--rates lora=1e-2,adapters=1e-2]
`--rates` gives methods another peak learning rate (PEFT methods usually want 10-30x full
fine-tuning's); the runs go to their own folders (`lora_1e-2__seed0`), so runs at two rates coexist.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

FINETUNE = "configs/local/bert_tiny_finetune_sst2.gin"
PRETRAIN = ["configs/local/bert_tiny_pretrain.gin", "gin/objectives/bert_mlm.gin"]
METHODS = {
    "full": [],
    "full_low": ["--gin.warmup_cosine.peak_learning_rate=1e-4"],
    "ulmfit": ["--gin_file=gin/optimizers/ulmfit.gin", "--gin.slanted_triangular.max_learning_rate=1e-3",
               "--gin.layerwise.unfreeze_every=40"],
    "lora": ["--gin_file=gin/peft/lora.gin"],
    "adapters": ["--gin_file=gin/peft/houlsby.gin"],
}


def t5lite(*argv: str) -> float:
    """Runs `t5lite ARGV` to its end (refusing a failure) and returns its CPU seconds."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "t5lite.cli", *argv], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def probe_accuracy(model: str, out: Path, ud: str) -> tuple[float, float]:
    """(last layer's POS probe accuracy, CPU seconds) of `t5lite probe` on `model`, written to `out`."""
    report = out / "probe.json"
    cpu = 0.0 if report.exists() else t5lite("probe", "--model", model, "--data_dir", ud, "--probes", "pos",
                                             "--no_control", "--out", str(out))
    (accuracy,) = [row["accuracy"][-1] for row in json.loads(report.read_text())["pos"].values()]
    return accuracy, cpu


def rate_flags(method: str, rate: str | None) -> list[str]:
    """The gin flag that sets `method`'s peak rate to `rate` (ULMFiT's schedule names it its own way)."""
    if rate is None:
        return []
    return [f"--gin.slanted_triangular.max_learning_rate={rate}" if method == "ulmfit"
            else f"--gin.warmup_cosine.peak_learning_rate={rate}"]


def parse_rates(text: str | None) -> dict[str, str]:
    """`lora=1e-2,adapters=1e-2` -> {method: rate}; an unknown method or a rate that is not a positive
    number is refused, naming it."""
    rates = dict(item.split("=", 1) if "=" in item else (item, "") for item in (text or "").split(",") if item)
    for method, rate in rates.items():
        try:
            ok = method in METHODS and float(rate) > 0
        except ValueError:
            ok = False
        if not ok:
            raise SystemExit(f"--rates {method}={rate}: expected METHOD=RATE with METHOD one of {', '.join(METHODS)} "
                             "and RATE a positive number, e.g. lora=1e-2")
    return rates


def run(method: str, seed: int, args, base_probe: float | None) -> dict:
    """One fine-tuning and its forgetting measurement (each skipped when already written)."""
    rate = args.rates.get(method)
    folder = Path(args.out) / (f"{method}__seed{seed}" if rate is None else f"{method}_{rate}__seed{seed}")
    cpu = 0.0
    if not (folder / "checkpoints" / str(args.steps)).is_dir():
        cpu += t5lite("train", f"--gin_file={FINETUNE}", *METHODS[method], *rate_flags(method, rate),
                      f"--gin.MODEL_DIR='{folder}'",
                      f"--gin.INITIAL_CHECKPOINT_PATH='{args.base}'", f"--gin.DATA_DIR='{args.data_dir}'",
                      f"--gin.train.seed={seed}", f"--gin.TRAIN_STEPS={args.steps}", f"--gin.EVAL_EVERY={args.steps}",
                      f"--gin.train.checkpoint_every={args.steps}")
    report = folder / "eval" / "forgetting.json"
    if not report.exists():
        cpu += t5lite("eval", "--forgetting", *(f"--gin_file={f}" for f in PRETRAIN),
                      f"--gin.CHECKPOINT_PATH='{folder}'", f"--gin.eval.max_examples={args.eval_examples}")
    measured = json.loads(report.read_text())
    evals = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if '"eval' in line]
    accuracy = [m["eval_accuracy"] for m in evals if "eval_accuracy" in m][-1]
    probe = {}
    if base_probe is not None:
        run_probe, seconds = probe_accuracy(str(folder), folder / "probe", args.ud)
        probe, cpu = {"probe_accuracy": run_probe, "probe_change": run_probe - base_probe}, cpu + seconds
    return {"method": method, "seed": seed, "accuracy": accuracy, "cpu_seconds": cpu, **probe,
            "forgetting": measured["run_metrics"]["mlm_loss"] - measured["base_metrics"]["mlm_loss"],
            "base_mlm_loss": measured["base_metrics"]["mlm_loss"], "mlm_loss": measured["run_metrics"]["mlm_loss"]}


def main() -> None:
    from t5lite.experiments import forgetting
    from t5lite.experiments.stats import t_interval
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the bert_tiny MLM pre-training run")
    parser.add_argument("--data_dir", required=True, help="the GLUE folder (SST-2/train.tsv, dev.tsv)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", default="0", help="comma-separated")
    parser.add_argument("--eval_examples", type=int, default=256, help="held-out MLM examples scored")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--ud", default=None, help="the UD folder (en_ewt/): also measure the POS probe's change")
    parser.add_argument("--rates", type=parse_rates, default={}, help="METHOD=RATE,...: other peak learning rates")
    args = parser.parse_args()
    started = time.time()
    base_probe, cpu = probe_accuracy(args.base, Path(args.out) / "base_probe", args.ud) if args.ud else (None, 0.0)
    rows = [run(m, int(s), args, base_probe) for m in args.methods.split(",") for s in args.seeds.split(",")]
    summary = forgetting.summarize({m: [(r["forgetting"], r["accuracy"]) for r in rows if r["method"] == m]
                                    for m in args.methods.split(",")})
    out = Path(args.out)
    (out / "forgetting.json").write_text(json.dumps({"runs": rows, "summary": summary}, indent=1))
    forgetting.plot(summary, str(out / "forgetting_frontier.png"),
                    f"bert_tiny MLM base fine-tuned on SST-2, {args.steps} steps, seed(s) {args.seeds}"
                    + "".join(f", {m} at {r}" for m, r in args.rates.items()))
    probe = {m: t_interval([100 * r["probe_change"] for r in rows if r["method"] == m]) for m in summary} \
        if args.ud else {}
    print("| method | seeds | MLM loss increase (95% CI) | SST-2 dev accuracy (95% CI) | frontier |"
          + (" POS probe change, points (95% CI) |" if probe else ""))
    print("|---|---|---|---|---|" + ("---|" if probe else ""))
    for m, r in summary.items():
        (f, fl, fh), (a, al, ah) = r["forgetting"], r["accuracy"]
        lens = f" {probe[m][0]:+.2f} [{probe[m][1]:+.2f}, {probe[m][2]:+.2f}] |" if probe else ""
        print(f"| {m} | {r['seeds']} | {f:+.4f} [{fl:+.4f}, {fh:+.4f}] | {a:.1f} [{al:.1f}, {ah:.1f}] | "
              f"{'yes' if r['on_frontier'] else ''} |{lens}")
    if args.ud:
        print(f"POS probe of the base at its last layer: {100 * base_probe:.2f}%")
    print(f"wrote {out / 'forgetting.json'} and {out / 'forgetting_frontier.png'} "
          f"({(cpu + sum(r['cpu_seconds'] for r in rows)) / 60:.1f} CPU-minutes run now, {(time.time() - started) / 60:.1f} min)")


if __name__ == "__main__":
    main()
