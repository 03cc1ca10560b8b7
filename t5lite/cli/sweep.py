"""`t5lite sweep`."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from t5lite.cli.gin_flags import REPO_ROOT
from t5lite.cli.inputs import positive_int
from t5lite.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `t5lite sweep` subcommand and its flags."""
    parser = subparsers.add_parser("sweep", parents=[common],
                                   help="run a grid of pre-train + fine-tune cells over seeds "
                                        "(--gin_file=configs/sweeps/NAME.gin) and report them")
    parser.add_argument("--out", required=True, help="the sweep's folder: a run directory per cell and seed, report.md")
    parser.add_argument("--parallel", type=positive_int, default=None,
                        help="cells run at once (default: the scale's `parallel`)")
    parser.set_defaults(fn=cmd_sweep)


def cmd_sweep(args, gin_files, gin_bindings) -> None:
    """Runs a sweep's unfinished cells (t5lite.experiments), then writes OUT/report.md and report.json."""
    from t5lite.experiments import report, runner, spec
    from t5lite.train.run_dir import RunLock
    sweep = spec.load(gin_files, gin_bindings, (os.getcwd(), str(REPO_ROOT)))
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out}: {e.strerror}; choose a folder that can be written") from None
    with RunLock(str(out), flag="--out"):   # a second sweep on the folder would rerun its cells
        runner.run_sweep(sweep, out, args.parallel)
        report.write(sweep, out)
    print(f"wrote {out / 'report.md'} and report.json")
