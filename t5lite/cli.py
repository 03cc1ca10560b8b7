"""`t5lite` command line: train | tasks (more subcommands arrive with their features).

Gin flags follow T5X: `--gin_file=F` (repeatable) and `--gin.NAME=VALUE` (a gin binding, so
strings need inner quotes: `--gin.MODEL_DIR="'/tmp/run'"`).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
REQUIRED_MACROS = ("MODEL_DIR", "TRAIN_STEPS", "BATCH_SIZE", "TASK_FEATURE_LENGTHS", "MIXTURE_OR_TASK_NAME")


def split_gin_flags(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Pulls `--gin_file` and `--gin.X=Y` out of argv: (files, bindings, remaining args)."""
    files, bindings, rest = [], [], []
    it = iter(argv)
    for arg in it:
        if arg.startswith("--gin_file"):
            value = arg.split("=", 1)[1] if "=" in arg else next(it, None)
            if value is None:
                raise SystemExit("--gin_file needs a value: --gin_file=configs/local/t5_tiny_pretrain.gin")
            files.extend(v for v in value.split(",") if v)
        elif arg.startswith("--gin."):
            if "=" not in arg:
                raise SystemExit(f"{arg}: write gin bindings as --gin.NAME=VALUE")
            name, value = arg[len("--gin."):].split("=", 1)
            bindings.append(f"{name} = {value}")
        else:
            rest.append(arg)
    return files, bindings, rest


def parse_gin(files: list[str], bindings: list[str], required_macros=REQUIRED_MACROS) -> None:
    """Parses gin files and bindings; a misspelled name or a missing macro fails here, by name."""
    import gin
    import t5lite.train.optimizers  # noqa: F401  (registers configurables)
    import t5lite.train.partitioning  # noqa: F401
    import t5lite.train.trainer  # noqa: F401
    for path in (os.getcwd(), str(REPO_ROOT)):
        gin.add_config_file_search_path(path)
    if not files:
        raise SystemExit("no --gin_file given; try --gin_file=configs/local/t5_tiny_pretrain.gin")
    try:
        gin.parse_config_files_and_bindings(files, bindings, finalize_config=False)
    except (ValueError, IOError, SyntaxError) as e:
        raise SystemExit(f"gin configuration error: {e}") from None
    missing = [m for m in required_macros if not _macro_defined(m)]
    if missing:
        hint = " ".join(f"--gin.{m}=..." for m in missing)
        raise SystemExit(f"missing required gin macro(s) {', '.join(missing)}: set them in a gin file or with {hint}")


def _macro_defined(name: str) -> bool:
    import gin
    try:
        gin.query_parameter(f"%{name}")
        return True
    except ValueError:
        return False


def cmd_train(args, gin_files, gin_bindings) -> None:
    import gin
    parse_gin(gin_files, gin_bindings)
    from t5lite.train.trainer import train
    metrics = train()
    print("final:", " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    print("model dir:", gin.query_parameter("%MODEL_DIR"))


def cmd_tasks(args, gin_files, gin_bindings) -> None:
    from t5lite.data import registry
    if args.action == "list":
        registry._register_builtin_tasks()
        for name in registry.TaskRegistry.names():
            print(name)
        for name in registry.MixtureRegistry.names():
            print(f"{name} (mixture)")
        return
    if not args.name:
        raise SystemExit("usage: t5lite tasks show NAME [--split S] [--data_dir D] [-n N]")
    from t5lite.data.tasks_show import show_examples
    try:
        task = registry.get_task_or_mixture(args.name)
    except KeyError as e:
        raise SystemExit(e.args[0]) from None
    lengths = dict(kv.split("=") for kv in args.sequence_length.split(",")) if args.sequence_length else None
    lengths = {k: int(v) for k, v in lengths.items()} if lengths else None
    print(task)
    show_examples(task, args.split, args.num_examples, data_dir=args.data_dir, sequence_length=lengths)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t5lite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train or resume a model (gin flags: --gin_file, --gin.NAME=VALUE)")
    train.set_defaults(fn=cmd_train)
    tasks = sub.add_parser("tasks", help="list tasks or show preprocessed examples of one")
    tasks.add_argument("action", choices=["list", "show"])
    tasks.add_argument("name", nargs="?")
    tasks.add_argument("--split", default="train")
    tasks.add_argument("--data_dir", default=None)
    tasks.add_argument("-n", "--num_examples", type=int, default=3)
    tasks.add_argument("--sequence_length", default="inputs=512,targets=114",
                       help="feature lengths for preprocessing, e.g. inputs=512,targets=114")
    tasks.set_defaults(fn=cmd_tasks)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    gin_files, gin_bindings, rest = split_gin_flags(argv)
    args = build_parser().parse_args(rest)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "orbax", "jax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args.fn(args, gin_files, gin_bindings)


if __name__ == "__main__":
    main()
