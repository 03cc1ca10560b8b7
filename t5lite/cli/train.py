"""`t5lite train`."""
from __future__ import annotations

import argparse
import contextlib
import logging

from t5lite.cli.gin_flags import check_task_name, parse_gin
from t5lite.cli.inputs import fraction
from t5lite.gin_checks import bound_value

# The t5lite loggers' levels at each console verbosity (t5lite.train.trainer's channels): --quiet
# keeps evaluations, saves and warnings; the cost line needs --verbose. metrics.jsonl keeps everything.
CONSOLE_LEVELS = {
    "quiet": {"t5lite": logging.WARNING, "t5lite.events": logging.INFO, "t5lite.cost": logging.WARNING},
    "default": {"t5lite": logging.INFO, "t5lite.events": logging.INFO, "t5lite.cost": logging.WARNING},
    "verbose": {"t5lite": logging.INFO, "t5lite.events": logging.INFO, "t5lite.cost": logging.INFO},
}
# Metrics of the `final:` line shown only with --verbose: utilisation, the z-loss, the cost and each
# kernel's sparsity.
VERBOSE_ONLY = ("mfu", "padded_mfu", "z_loss", "cost_", "sparsity/")


def add_parser(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `t5lite train` subcommand and its flags."""
    parser = subparsers.add_parser("train", parents=[common],
                                   help="train or resume a model (gin flags: --gin_file, --gin.NAME=VALUE)")
    parser.add_argument("--prune_heads", type=fraction, default=None, metavar="FRACTION",
                        help="prune this fraction of the attention heads, least important first (Michel et al.), "
                             "from the starting params: train.pruning=@HeadPruning() with HeadPruning.fraction")
    console = parser.add_mutually_exclusive_group()
    console.add_argument("--verbose", dest="console", action="store_const", const="verbose", default="default",
                         help="also print MFU, padded_mfu, z_loss and the cost (kg CO2e, $) on the console")
    console.add_argument("--quiet", dest="console", action="store_const", const="quiet",
                         help="print only the evaluations, the saves and the end (no progress bar)")
    parser.set_defaults(fn=cmd_train)


def cmd_train(args, gin_files, gin_bindings) -> None:
    import gin
    from t5lite.train.trainer import train
    if args.prune_heads is not None:   # Michel et al.'s head pruning of the starting params
        gin_bindings = [*gin_bindings, "train.pruning = @HeadPruning()", f"HeadPruning.fraction = {args.prune_heads}"]
    parse_gin(gin_files, gin_bindings, entry=("train", train))
    check_task_name("train")
    with console_levels(args.console):
        metrics = train(progress=args.console != "quiet")
        if metrics:  # empty when the run was already at TRAIN_STEPS (train() says so)
            print(final_line(metrics, verbose=args.console == "verbose", split=_evaluated_split(train)))
    print("model dir:", gin.query_parameter("%MODEL_DIR"))


@contextlib.contextmanager
def console_levels(console: str):
    """The t5lite loggers at `console`'s levels for the run, restored after it."""
    loggers = {name: logging.getLogger(name) for name in CONSOLE_LEVELS[console]}
    before = {name: logger.level for name, logger in loggers.items()}
    try:
        for name, logger in loggers.items():
            logger.setLevel(CONSOLE_LEVELS[console][name])
        yield
    finally:
        for name, logger in loggers.items():
            logger.setLevel(before[name])


def _evaluated_split(train) -> str:
    """The console name of the split the run evaluates: gin's `train.eval_split`, else its default."""
    import inspect

    from t5lite.train.trainer import console_split
    return console_split(bound_value("train.eval_split", inspect.signature(train).parameters["eval_split"].default))


def final_line(metrics: dict, verbose: bool = False, split: str = "dev") -> str:
    """`final: train loss=... | dev accuracy=...`: the last logged training metrics and the last
    evaluation's, each group labelled (the evaluation by its split's console name; utilisation and
    cost only when `verbose`)."""
    shown = {k: v for k, v in metrics.items() if verbose or not k.startswith(VERBOSE_ONLY)}
    evaluated = {k.removeprefix("eval_"): v for k, v in shown.items() if k.startswith("eval_")}
    train = {k: v for k, v in shown.items() if not k.startswith(("eval_", "teacher_eval_"))}
    groups = [("train", train), (split, evaluated)]
    return "final: " + " | ".join(f"{name} " + " ".join(f"{k}={v:.4g}" for k, v in group.items())
                                  for name, group in groups if group)
