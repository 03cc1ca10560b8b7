"""What a command reads besides gin: input texts or a file of them (infer, embed: the flags and the file), a task
or mixture by name, and its numeric flags, each range-checked as it is parsed."""
from __future__ import annotations

import argparse
import json
import logging
import math

from t5lite.errors import ConfigError, DataError


def number_flag(kind: type, accepts, describe: str):
    """An argparse `type=` reading a `kind` that `accepts`; anything else (a negative count, which
    Python would take as a slice from the end, NaN, text) is refused in one line naming the flag."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not accepts(value):
            raise argparse.ArgumentTypeError(f"give {describe}, not {text}")
        return value
    return parse


positive_int = number_flag(int, lambda n: n >= 1, "a whole number >= 1")
nonnegative_int = number_flag(int, lambda n: n >= 0, "a whole number >= 0")
nonnegative_float = number_flag(float, lambda x: 0 <= x < math.inf, "a finite number >= 0")
positive_float = number_flag(float, lambda x: 0 < x < math.inf, "a finite number > 0")
fraction = number_flag(float, lambda x: 0 < x < 1, "a fraction between 0 and 1 (both excluded)")


def add_text_inputs(parser: argparse.ArgumentParser, text_help: str) -> None:
    """The input flags `t5lite infer` and `t5lite embed` share: texts, or a file of them."""
    parser.add_argument("text", nargs="*", help=text_help)
    parser.add_argument("--input_file", default=None,
                        help="a UTF-8 file with one input text per line, or JSON lines (.jsonl or --field)")
    parser.add_argument("--field", default=None, help="the input field of JSON lines (default: input)")


def _numbered_lines(path: str) -> list[tuple[int, str]]:
    """(line number, text) of the non-blank lines of a UTF-8 file; a bad byte is reported by line
    and file offset. Blank lines are skipped with a warning naming them (the outputs then number
    fewer than the file's lines), and a file without a non-blank line is an error."""
    from etils import epath
    try:
        data = epath.Path(path).read_bytes()
    except OSError as e:
        raise DataError(f"--input_file {path}: cannot read it ({e.strerror or e})") from e
    lines, offset = [], 0
    for number, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"--input_file {path}: line {number} is not UTF-8 (byte {offset + e.start} of the file, "
                            f"{raw[e.start:e.start + 1]!r}); save the file as UTF-8, e.g. "
                            f"`iconv -f latin1 -t utf-8 {path} > inputs.utf8.txt`") from None
        offset += len(raw) + 1
        if line.strip():
            lines.append((number, line.rstrip("\r")))
    if not lines:
        raise DataError(f"--input_file {path} is empty (no non-blank line); write one input per line")
    last = len(data.split(b"\n")) - (1 if data.endswith(b"\n") else 0)   # a final newline ends a line
    blank = sorted(set(range(1, last + 1)) - {number for number, _ in lines})
    if blank:
        shown = ", ".join(map(str, blank[:10])) + (", ..." if len(blank) > 10 else "")
        logging.getLogger("t5lite.infer").warning("--input_file %s: skipped %d blank line(s) (line %s); each non-blank "
                                                  "line is one input", path, len(blank), shown)
    return lines


def read_inputs(path: str, field: str | None = None) -> list[str]:
    """The inputs of a prompts file: one per non-blank line, or, for JSON lines (a `.jsonl` file or
    a `field` given), each line's `field` ("input" by default)."""
    lines = _numbered_lines(path)
    if field is None and not path.endswith(".jsonl"):
        return [text for _, text in lines]
    field = field or "input"
    texts = []
    for number, text in lines:
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"--input_file {path}: line {number} is not valid JSON ({e.msg}, column {e.colno}); "
                            f"write one object per line, e.g. {{\"{field}\": \"a prompt\"}}") from None
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            found = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise DataError(f"--input_file {path}: line {number} has no string field {field!r} (found {found}); "
                            "name the input field with --field")
        texts.append(record[field])
    return texts


def input_texts(args: argparse.Namespace, verb: str, item: str) -> list[str]:
    """The texts of `add_text_inputs`' flags: the arguments, then --input_file's; none is refused."""
    texts = list(args.text) + (read_inputs(args.input_file, args.field) if args.input_file else [])
    if not texts:
        raise ConfigError(f"nothing to {verb}: give texts as arguments or --input_file=FILE (one {item} per line, "
                          "or JSON lines)")
    return texts


def get_task_or_mixture(name: str):
    """The catalog's task or mixture; an unknown name is a user error (one line, exit code 2)."""
    from t5lite.data import catalog
    try:
        return catalog.get_task_or_mixture(name)
    except KeyError as e:
        raise ConfigError(e.args[0]) from None
