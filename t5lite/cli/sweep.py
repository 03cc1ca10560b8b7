"""`t5lite sweep`."""
from __future__ import annotations

import argparse
import dataclasses
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
    parser.add_argument("--seeds", type=positive_int, default=None, metavar="N",
                        help="run seeds 0..N-1 instead of the scale's (as many as the pilot's 'needs N seeds'); "
                             "the seeds already finished in OUT are reused")
    parser.add_argument("--cells", type=comma_separated, default=None,
                        help="run only these cells (NAME,NAME,...) and the claims between them; "
                             "a later run without it reuses their folders")
    parser.add_argument("--pilot", action="store_true",
                        help="run the sweep's pilot instead (OUT/pilot: the claims' cells, the scale's `pilot` "
                             "seeds) and print the seeds each claim needs, per task")
    parser.add_argument("--rebuild", metavar="REPORT.json", type=Path, default=None,
                        help="train nothing: rebuild OUT's report from the per-seed results a report.json keeps, "
                             "judged with this version's statistics and the gin's claims")
    parser.set_defaults(fn=cmd_sweep)


def comma_separated(text: str) -> list[str]:
    """An argparse `type=`: the names in NAME,NAME,...; none at all is refused in one line."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"give one or more cell names separated by commas, not {text!r}")
    return names


def cmd_sweep(args, gin_files, gin_bindings) -> None:
    """Runs a sweep's unfinished cells (t5lite.experiments), then writes OUT/report.md and report.json;
    with --pilot, its pilot's in OUT/pilot, and prints what the pilot measured. A sweep whose pilot has
    run prints that first. With --rebuild, writes the report from a report.json's seeds instead and
    prints each claim's verdict."""
    from t5lite.experiments import rebuild, report, runner, spec
    from t5lite.train.run_dir import RunLock
    sweep = spec.load(gin_files, gin_bindings, (os.getcwd(), str(REPO_ROOT)))
    if args.cells is not None:
        sweep = spec.only_cells(sweep, args.cells)
    if args.pilot:
        sweep = spec.pilot(sweep)
    if args.seeds is not None:
        if args.pilot and args.seeds < 2:
            raise ConfigError(f"--seeds {args.seeds} with --pilot: a pilot measures the spread between seeds; give 2 or more")
        sweep = dataclasses.replace(sweep, seeds=tuple(range(args.seeds)))
    out = Path(args.out)
    runs = out / "pilot" if args.pilot else out
    stored = None   # refused before OUT exists
    if args.rebuild is not None:
        sweep, stored = rebuild.stored_results(sweep, args.rebuild)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out}: {e.strerror}; choose a folder that can be written") from None
    with RunLock(str(out), flag="--out"):   # a second sweep on the folder would rerun its cells
        if stored is not None:
            runs.mkdir(exist_ok=True)
            made = report.write(sweep, runs, stored)
            print("\n".join([f"rebuilt {sweep.name} ({sweep.scale}, seeds {list(sweep.seeds)}) from {args.rebuild}:",
                             *(f"  {c['claim']}: {c['verdict']}" for c in made["claims"]),
                             f"wrote {runs / 'report.md'} and report.json"]))
            return
        if not args.pilot and isinstance(pilot := runner.read_json(out / "pilot" / "report.json"), dict):
            print("\n".join(["the pilot measured:", *report.plan(pilot), f"this sweep runs seeds {list(sweep.seeds)}"]),
                  flush=True)
        runner.run_sweep(sweep, runs, args.parallel)
        made = report.write(sweep, runs)
    if args.pilot:
        print("\n".join(report.plan(made)))
    print(f"wrote {runs / 'report.md'} and report.json")
