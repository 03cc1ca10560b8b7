"""`t5lite` command line: train | eval | infer | embed | convert | tasks | prepare | compile | probe | attention.

Gin flags follow T5X: `--gin_file=F` (repeatable) and `--gin.NAME=VALUE` (a gin binding, so
strings need inner quotes: `--gin.MODEL_DIR="'/tmp/run'"`). `eval` and `infer` read
gin/eval.gin or gin/infer.gin first, so a training config serves them as it is:

    t5lite eval --gin_file=configs/local/t5_tiny_finetune_sst2.gin --gin.MODEL_DIR="'/tmp/ft'"
    t5lite infer --gin_file=configs/local/t5_tiny_pretrain.gin --gin.CHECKPOINT_PATH="'/tmp/pt'" "some text"
"""
# The docstring above is `t5lite --help`'s description. Each command is a module of this package: add_parser()
# (its subcommand and flags) and cmd_<name>(); gin_flags and inputs hold what several commands share; here are
# the parser and main().
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from t5lite import platforms
from t5lite.cli import analysis, convert, embed, evaluate, infer, prepare, sweep, tasks, tpu_compile, train
from t5lite.cli.gin_flags import REPO_ROOT, check_task_name, parse_gin, split_gin_flags
from t5lite.cli.inputs import get_task_or_mixture, read_inputs
from t5lite.cli.tasks import parse_lengths
from t5lite.errors import T5liteError

# What is imported from t5lite.cli: the console script's main() and the pieces tests call.
__all__ = ["REPO_ROOT", "build_parser", "check_task_name", "get_task_or_mixture", "main", "parse_gin", "parse_lengths",
           "read_inputs", "split_gin_flags", "user_message"]

# The command modules in `t5lite --help`'s order (analysis adds probe and attention).
COMMAND_MODULES = (train, evaluate, infer, embed, convert, tasks, prepare, tpu_compile, analysis, sweep)


class Parser(argparse.ArgumentParser):
    """argparse reporting a bad flag as t5lite reports bad input: one line naming it, exit code 2 (the
    usage is what --help prints). Its subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"t5lite: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="show the traceback of t5lite's own errors too (or set T5LITE_DEBUG=1)")
    parser = Parser(prog="t5lite", description=__doc__, parents=[common],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.add_parser(sub, common)
    return parser


def configure_jax() -> None:
    """Compiled programs cached on disk (a resumed or repeated run skips XLA's compile), the CPU alone
    on a machine without accelerators unless JAX_PLATFORMS says otherwise (t5lite.platforms), and on
    a multi-host slice (T5LITE_DISTRIBUTED=1, set by tpu_scripts/run.sh) joining the other hosts."""
    import jax
    from t5lite.data.vocab import default_cache_dir
    chosen = platforms.default_platforms()
    if chosen:
        jax.config.update("jax_platforms", chosen)
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.join(default_cache_dir(), "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    if os.environ.get("T5LITE_DISTRIBUTED") == "1":
        jax.distributed.initialize()


def main(argv: list[str] | None = None) -> None:
    """Runs a command. A `T5liteError` (the user's input at fault) prints as one message with exit
    code 2, its traceback only with --debug or T5LITE_DEBUG=1; anything else is a bug and keeps its
    traceback (exit code 1)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or os.environ.get("T5LITE_DEBUG", "") not in ("", "0")
    try:
        gin_files, gin_bindings, rest = split_gin_flags(argv)
        args = build_parser().parse_args(rest)
        configure_jax()
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for noisy in ("absl", "orbax", "jax", "fsspec", "gcsfs"):  # gcsfs: gs:// paths without TensorFlow
            logging.getLogger(noisy).setLevel(logging.WARNING)
        args.fn(args, gin_files, gin_bindings)
    except T5liteError as e:
        if debug:
            traceback.print_exc()
        print(f"t5lite: error: {user_message(e)}", file=sys.stderr)
        raise SystemExit(2) from None


def user_message(error: BaseException) -> str:
    """The error's message without the "In call to configurable ..." lines gin appends."""
    return "\n".join(line for line in str(error).splitlines()
                     if not line.strip().startswith("In call to configurable")).strip()
