"""`t5lite train`."""
from __future__ import annotations

import argparse

from t5lite.cli.gin_flags import check_task_name, parse_gin
from t5lite.cli.inputs import fraction


def add_parser(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `t5lite train` subcommand and its flags."""
    parser = subparsers.add_parser("train", parents=[common],
                                   help="train or resume a model (gin flags: --gin_file, --gin.NAME=VALUE)")
    parser.add_argument("--prune_heads", type=fraction, default=None, metavar="FRACTION",
                        help="prune this fraction of the attention heads, least important first (Michel et al.), "
                             "from the starting params: train.pruning=@HeadPruning() with HeadPruning.fraction")
    parser.set_defaults(fn=cmd_train)


def cmd_train(args, gin_files, gin_bindings) -> None:
    import gin
    from t5lite.train.trainer import train
    if args.prune_heads is not None:   # Michel et al.'s head pruning of the starting params
        gin_bindings = [*gin_bindings, "train.pruning = @HeadPruning()", f"HeadPruning.fraction = {args.prune_heads}"]
    parse_gin(gin_files, gin_bindings, entry=("train", train))
    check_task_name("train")
    metrics = train()
    if metrics:  # empty when the run was already at TRAIN_STEPS (train() says so)
        print("final:", " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    print("model dir:", gin.query_parameter("%MODEL_DIR"))
