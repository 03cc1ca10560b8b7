"""Every shell block of README.md and docs/ is copy-pasteable after its page's setup block: each
`t5lite` command is one the CLI's own parser accepts (command, flags, their values' shapes), each
`--gin_file` exists, each `--gin.name.param` names a configurable and its parameter, and each `$VAR`
is set on the same page or is one of the environment's own (ENVIRONMENT)."""
import contextlib
import functools
import io
import re
import shlex

import pytest

from conftest import REPO
from test_docs import PAGES, _commands, _exists, _parameters, _registered_configurables, _text
from t5lite import cli

SHELL_BLOCK = re.compile(r"```(?:bash|sh|shell|console)\n(.*?)```", re.S)
# What a shell or the CLI sets, which no page needs to: the user's own environment and t5lite's documented variables.
ENVIRONMENT = {"HOME", "PATH", "PWD", "USER", "T5LITE_CACHE", "T5LITE_DEBUG"}
SEPARATOR = re.compile(r"\s*(?:&&|\|\||;|\|)\s*")
BINDING = re.compile(r"--gin\.([a-z]\w*)\.(\w+)=")


def _segments(block: str) -> list[str]:
    """The simple commands of a block: continuation lines joined, comments dropped, split at ; && || |,
    with a leading `do`/`then` dropped."""
    pieces = (p for command in _commands(block) for p in SEPARATOR.split(command.split(" # ")[0]))
    return [re.sub(r"^(?:do|then)\s+", "", p) for p in pieces if p.strip()]


def _assignments(segments: list[str]) -> dict[str, str]:
    """The variables the segments set and a value each: `NAME=...`, `export A=1 B=2`, `for NAME in a b`
    (its first value); a command substitution `$(...)` reads as a plain word."""
    values = {}
    for segment in segments:
        loop = re.match(r"for\s+(\w+)\s+in\s+(\S+)", segment)
        if loop:
            values[loop.group(1)] = loop.group(2)
        pattern = r"(?:^export\s+|\s)([A-Za-z_]\w*)=(\S*)" if segment.startswith("export ") else r"^([A-Za-z_]\w*)=(.*)"
        for name, value in re.findall(pattern, segment):
            values[name] = "value" if "$(" in value else " ".join(shlex.split(value))
    return values


def _variables_used(segments: list[str]) -> set[str]:
    return {name for segment in segments for name in re.findall(r"\$\{?([A-Za-z_]\w*)", segment)}


def _expand(segment: str, values: dict[str, str]) -> str:
    """The segment with each variable the page sets replaced by its value, as the shell reads it."""
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: values.get(m.group(1), m.group(0)), segment)


@functools.cache
def _parser():
    return cli.build_parser()


def _cli_problem(segment: str) -> str | None:
    """Why `t5lite ...` would stop before any work (argparse's one line), or None."""
    argv = shlex.split(segment)[1:]
    files, bindings, rest = cli.split_gin_flags(argv)
    missing = [f for f in files if not _exists(f)]
    if missing:
        return f"no such gin file {missing[0]}"
    configurables = _registered_configurables()
    for name, param in BINDING.findall(segment):
        if name not in configurables or param not in _parameters(configurables[name]):
            return f"--gin.{name}.{param}: no such configurable parameter"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            _parser().parse_args(rest)
    except SystemExit as stop:
        if stop.code:
            return stderr.getvalue().strip()
    return None


def page_problems(text: str) -> list[str]:
    """What stops a reader who pastes the page's shell blocks in order: unknown commands, flags, gin
    files and bindings, variables the page never sets, placeholder paths such as /path/to/data."""
    segments = [s for block in SHELL_BLOCK.findall(text) for s in _segments(block)]
    values = _assignments(segments)
    unset = sorted(_variables_used(segments) - set(values) - ENVIRONMENT)
    problems = [f"${name} is used but never set on the page" for name in unset]
    problems += [f"{s[:80]}: a placeholder path; set a variable in the page's setup block" for s in segments
                 if "/path/to" in s]
    for segment in segments:
        if re.match(r"(?:\S*/)?t5lite\s", segment):
            problem = _cli_problem(_expand(segment, values))
            if problem:
                problems.append(f"{segment[:80]}: {problem}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_shell_block_of_the_page_can_be_pasted(page):
    problems = page_problems(_text(page))
    assert not problems, problems


BAD_PAGE = """```bash
t5lite trian --gin_file=configs/local/t5_tiny_pretrain.gin
t5lite train --gin_file=configs/local/t5_tiny_pretrian.gin
t5lite eval --gin_file=configs/local/t5_tiny_pretrain.gin --max_exampels 3
t5lite train --gin_file=configs/local/t5_tiny_pretrain.gin --gin.train.log_evry=1
t5lite tasks show glue_sst2 --data_dir $GLEU
t5lite tasks show uner_en_ewt --data_dir /path/to/ud
```"""


def test_a_typo_in_a_command_is_caught():
    """The check fails on a misspelled command, gin file, flag, binding and variable, and passes the
    same block spelled right."""
    problems = page_problems(BAD_PAGE)
    assert len(problems) == 6, problems
    for typo in ("t5lite trian", "t5_tiny_pretrian.gin", "--max_exampels", "train.log_evry", "$GLEU", "/path/to/ud"):
        assert sum(typo in p for p in problems) == 1, (typo, problems)
    fixed = re.sub(r"--max_exampels 3", "", BAD_PAGE.replace("trian", "train").replace("pretrian", "pretrain")
                   .replace("log_evry", "log_every")).replace("$GLEU", "$GLUE")
    fixed = fixed.replace("/path/to/ud", "$UD").replace("```bash\n", "```bash\nGLUE=data/glue\nUD=data/ud\n")
    assert page_problems(fixed) == []
