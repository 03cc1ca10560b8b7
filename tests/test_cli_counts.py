"""Every numeric flag of every `t5lite` command is range-checked as it is parsed: a negative count
(which Python would take as a slice from the end) or a zero one that means nothing is one line
naming the flag, exit code 2, before any work and without creating an output."""
from __future__ import annotations

import argparse

import pytest

from t5lite import cli
from t5lite.cli.inputs import fraction, nonnegative_float, nonnegative_int, positive_int

# The values each checked type refuses.
REFUSED = {positive_int: ["-1", "0", "2.5", "many"], nonnegative_int: ["-1", "1e3"],
           nonnegative_float: ["-1", "nan", "inf"], fraction: ["0", "1", "-0.5", "nan"]}
# Numeric flags that take any whole number, and why.
SIGNED = {("probe", "--layer"): "negative layers count from the top; the model's depth bounds it"}


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def _numeric_flags():
    """(command, flag, its argparse type) of every flag that reads a number or defaults to one."""
    for command, parser in _subcommands().items():
        for action in parser._actions:
            number_default = isinstance(action.default, (int, float)) and not isinstance(action.default, bool)
            if action.type in (int, float, *REFUSED) or (action.type is None and number_default and action.nargs != 0):
                yield command, action.option_strings[-1], action.type


def _refused(capsys, argv: list[str]) -> str:
    """The one line `t5lite ARGV` prints on stderr, once it exits 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("argv, message", [
    (["probe", "--train_sentences", "-5"], "argument --train_sentences: give a whole number >= 1, not -5"),
    (["attention", "--sentences", "-3"], "argument --sentences: give a whole number >= 1, not -3"),
    (["probe", "--neighbours", "bank", "--corpus", "c.txt", "--corpus_sentences", "-1"],
     "argument --corpus_sentences: give a whole number >= 1, not -1"),
    (["probe", "--neighbours", "bank", "--corpus", "c.txt", "--k", "0"], "argument --k: give a whole number >= 1, not 0"),
    (["probe", "--neighbours", "bank", "--corpus", "c.txt", "--k", "-3"], "argument --k: give a whole number >= 1, not -3"),
    (["prepare", "--input", "page.txt", "--min_words", "-1"], "argument --min_words: give a whole number >= 0, not -1"),
])
def test_a_negative_or_empty_count_is_one_line_naming_the_flag(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    command = argv[0]
    place = ["--output", str(out)] if command == "prepare" else ["--model", "run", "--data_dir", "ud", "--out", str(out)]
    assert _refused(capsys, [*argv, *place]) == f"t5lite: error: {message} (see t5lite {command} --help)"
    assert not out.exists()


def test_every_numeric_flag_has_a_checked_type():
    """A new count flag read with plain `type=int` (or converted later) fails here: give it
    positive_int or nonnegative_int (t5lite.cli.inputs), or list it in SIGNED with the reason."""
    flags = list(_numeric_flags())
    assert len(flags) >= 15
    unchecked = [(command, flag) for command, flag, kind in flags if kind not in REFUSED]
    assert sorted(unchecked) == sorted(SIGNED)


CHECKED = [f for f in _numeric_flags() if f[2] in REFUSED]


@pytest.mark.parametrize("command, flag, kind", CHECKED, ids=[f"{command} {flag}" for command, flag, _ in CHECKED])
def test_every_checked_flag_refuses_what_its_type_does_not_take(capsys, command, flag, kind):
    for value in REFUSED[kind]:
        line = _refused(capsys, [command, flag, value])
        assert line.startswith("t5lite: error: argument ") and flag in line and f"not {value} " in line, line


def test_the_edges_a_count_takes_are_accepted():
    args = cli.build_parser().parse_args(["probe", "--model", "m", "--out", "o", "--k", "1", "--seed", "0",
                                          "--l2", "0", "--corpus_sentences", "1"])
    assert (args.k, args.seed, args.l2, args.corpus_sentences) == (1, 0, 0.0, 1)
    args = cli.build_parser().parse_args(["prepare", "--input", "x", "--output", "o", "--min_words", "0"])
    assert args.min_words == 0
    assert cli.build_parser().parse_args(["train", "--prune_heads", "0.25"]).prune_heads == 0.25


def test_an_example_beyond_the_sentences_is_refused_before_the_model_loads(tmp_path, capsys):
    out = tmp_path / "out"
    line = _refused(capsys, ["attention", "--model", str(tmp_path / "no_model"), "--data_dir", str(tmp_path),
                             "--out", str(out), "--sentences", "3", "--example", "3"])
    assert line == "t5lite: error: --example 3: choose one of the first --sentences 3 (0 to 2)"
    assert not out.exists()
