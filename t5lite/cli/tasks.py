"""`t5lite tasks list | show`."""
from __future__ import annotations

import argparse

from t5lite.cli.inputs import get_task_or_mixture, positive_int
from t5lite.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `t5lite tasks` subcommand and its flags."""
    parser = subparsers.add_parser("tasks", parents=[common], help="list tasks or show preprocessed examples of one")
    parser.add_argument("action", choices=["list", "show"])
    parser.add_argument("name", nargs="?")
    parser.add_argument("--split", default="train")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("-n", "--num_examples", type=positive_int, default=3)
    parser.add_argument("--sequence_length", default="inputs=512,targets=114",
                        help="feature lengths for preprocessing, e.g. inputs=512,targets=114")
    parser.add_argument("--all_ids", action="store_true",
                        help="print every token id (by default the first 10 and last 5, with how many are left out)")
    parser.set_defaults(fn=cmd_tasks)


def cmd_tasks(args, gin_files, gin_bindings) -> None:
    from t5lite.data import catalog
    if args.action == "list":
        tasks, mixtures = catalog.names()
        for name in tasks:
            print(name)
        for name in mixtures:
            print(f"{name} (mixture)")
        return
    if not args.name:
        raise ConfigError("usage: t5lite tasks show NAME [--split S] [--data_dir D] [-n N]")
    from t5lite.data.tasks_show import show_examples
    task = get_task_or_mixture(args.name)
    lengths = parse_lengths(args.sequence_length) if args.sequence_length else None
    print(task)
    show_examples(task, args.split, args.num_examples, data_dir=args.data_dir, sequence_length=lengths,
                  all_ids=args.all_ids)


def parse_lengths(text: str) -> dict[str, int]:
    """`inputs=512,targets=114` as {"inputs": 512, "targets": 114}."""
    try:
        return {name.strip(): int(length) for name, length in (kv.split("=") for kv in text.split(","))}
    except ValueError:
        raise ConfigError(f"--sequence_length {text!r}: write FEATURE=LENGTH pairs, "
                          "e.g. inputs=512,targets=114") from None
