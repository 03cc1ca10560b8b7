"""The documentation stays true: the site builds with no broken link, the README's Quickstart and
next-steps commands run (at tiny sizes), and every path, CLI flag, gin configurable, preset and task
that README.md and docs/ name exists."""
import inspect
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, shared_data_dir
from t5lite import cli

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, REPO / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]
COMMANDS = ("train", "eval", "infer", "embed", "convert", "tasks", "prepare", "compile", "probe", "attention", "sweep")

# Appended to each `t5lite` command of the README's Quickstart and next steps: tiny sizes, and the
# test data instead of the download the README shows. Only what the command reads is bound (an unused
# macro is an error). No spaces inside a flag: the shell splits the variable into flags.
def docs_test_bindings(command: str) -> str:
    kind = command.split()[1]
    flags = {
        "train": ["--gin.TRAIN_STEPS=2", "--gin.BATCH_SIZE=2", "--gin.TASK_FEATURE_LENGTHS={'inputs':32,'targets':8}",
                  "--gin.train.log_every=1", "--gin.train.checkpoint_every=2", "--gin.train.eval_max_examples=4"],
        "eval": ["--gin.TASK_FEATURE_LENGTHS={'inputs':32,'targets':8}", "--gin.eval.max_examples=4"],
        "infer": ["--gin.infer.max_decode_length=4"],
    }.get(kind, [])
    if "--gin.DATA_DIR=" in command:
        flags.append(f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'")
        if kind == "train":
            flags.append("--gin.EVAL_EVERY=2")
    return " ".join(flags)


def _text(path) -> str:
    return path.read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    """The text under a `## heading` up to the next `## `."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def _code_blocks(text: str, language: str = "bash") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def _commands(block: str) -> list[str]:
    """Shell commands of a code block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]


# --- the site ------------------------------------------------------------------------------------

def test_mkdocs_site_builds_strict(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, a page missing from the nav or an API page
    whose object does not exist fails the build."""
    pytest.importorskip("mkdocs", reason="the docs extra (mkdocs, mkdocs-material, mkdocstrings) builds the site")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    site = tmp_path / "site"
    assert (site / "reference" / "api" / "index.html").exists()
    # search: the index the search box loads holds every page of the nav, and its worker ships
    index = json.loads((site / "search" / "search_index.json").read_text())
    indexed = {doc["location"].split("#")[0] for doc in index["docs"]}
    assert {"" if page == "index.md" else page[:-len(".md")] + "/" for page in _nav_pages()} <= indexed
    assert list((site / "assets" / "javascripts" / "workers").glob("search.*.js"))
    home = (site / "index.html").read_text()
    assert "<th></th>" not in home and "<th>Area</th>" in home   # the feature table's header names its columns
    assert 'href="assets/stylesheets/extra.css"' in home   # wide tables scroll with a visible scrollbar


def _nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav lists, as paths under docs/."""
    yaml = pytest.importorskip("yaml", reason="PyYAML (a dependency of mkdocs) reads mkdocs.yml")

    def pages(nav):
        for item in nav:
            for value in item.values():
                yield from (pages(value) if isinstance(value, list) else [value])
    return list(pages(yaml.safe_load(_text(REPO / "mkdocs.yml"))["nav"]))


def test_every_docs_page_is_in_the_nav():
    assert sorted(_nav_pages()) == sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))


# --- the README's commands -----------------------------------------------------------------------

def _readme_commands() -> list[str]:
    text = _text(README)
    return [c for heading in ("Quickstart", "Next steps") for block in _code_blocks(_section(text, heading))
            for c in _commands(block)]


def test_readme_make_targets_run_the_commands_it_shows():
    commands = _readme_commands()
    assert {c for c in commands if c.startswith("make ")} == {"make demo", "make test"}
    demo = subprocess.run(["make", "-n", "-B", "demo"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    shown = next(c for c in commands if c.startswith("t5lite train --gin_file=configs/local/t5_tiny_pretrain.gin"))
    assert f".venv/bin/{shown}" in demo.splitlines()
    test = subprocess.run(["make", "-n", "-B", "test"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "-m pytest" in test and '".[test,hf,reference,tpu,docs]"' in test


def _parse_like_the_cli(argv: list[str]) -> None:
    """What a command checks before any work: its flags, gin files, bindings, required macros and task."""
    import gin
    from t5lite.infer.evaluation import evaluate
    from t5lite.infer.predict import infer
    from t5lite.train.trainer import train
    files, bindings, rest = cli.split_gin_flags(argv)
    args = cli.build_parser().parse_args(rest)
    gin.clear_config()
    try:
        if args.command == "train":
            cli.parse_gin(files, bindings, entry=("train", train))
            cli.check_task_name("train")
        elif args.command == "eval":
            cli.parse_gin(files, bindings, required_macros=(), entry=("eval", evaluate), base_file="gin/eval.gin")
            cli.check_task_name("eval")
        elif args.command == "infer":
            cli.parse_gin(files, bindings, required_macros=(), entry=("infer", infer), base_file="gin/infer.gin")
        elif args.command == "tasks" and args.name:
            cli.get_task_or_mixture(args.name)
    finally:
        gin.clear_config()


def test_readme_commands_parse_as_the_cli_parses_them():
    """The fast sibling of the next test: every README command is accepted up to the point where work
    would start (flags, gin files and bindings, required macros such as DATA_DIR, the task's name)."""
    import shlex
    runnable = [c for c in _readme_commands() if c.startswith("t5lite ")]
    assert len(runnable) == 7
    for command in runnable:
        _parse_like_the_cli(shlex.split(command)[1:])


@pytest.mark.slow
def test_readme_quickstart_and_next_steps_commands_run(tmp_path):
    """Every `t5lite` command of the README's Quickstart and next steps, as a user types it in the
    checkout (configs/ and gin/ beside runs/), with T5LITE_DOCS_TEST_BINDINGS appended (tiny sizes,
    the test data): the demo run is trained, shown, decoded and evaluated, then fine-tuned on SST-2,
    evaluated and decoded."""
    commands = _readme_commands()
    runnable = [c for c in commands if c.startswith("t5lite ")]
    skipped = [c for c in commands if not c.startswith(("t5lite ", "make "))]
    assert all("curl" in c for c in skipped), skipped   # only the download, replaced by DATA_DIR below
    assert [c.split()[1] for c in runnable] == ["train", "tasks", "infer", "eval", "train", "eval", "infer"]
    script = "\n".join(["set -euo pipefail", 't5lite() { "$PYTHON" -m t5lite.cli "$@" $T5LITE_DOCS_TEST_BINDINGS; }',
                        *(f'echo ">>> {c.split()[1]}"; T5LITE_DOCS_TEST_BINDINGS="$BINDINGS_{i}"\n{c}'
                          for i, c in enumerate(runnable))])
    for folder in ("configs", "gin"):   # a user runs them in the checkout; runs/ goes to tmp_path here
        (tmp_path / folder).symlink_to(REPO / folder)
    env = {**os.environ, "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           **{f"BINDINGS_{i}": docs_test_bindings(c) for i, c in enumerate(runnable)}}
    run = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    assert (tmp_path / "runs" / "demo" / "model_config.json").exists()
    assert (tmp_path / "runs" / "demo" / "eval" / "embedded_docs_span_corruption.validation").is_dir()
    assert (tmp_path / "runs" / "sst2" / "eval" / "glue_sst2.validation" / "predictions.jsonl").exists()
    assert '"prediction"' in run.stdout and "accuracy=" in run.stdout


# --- what the docs name exists -------------------------------------------------------------------

PATH_PATTERN = re.compile(r"(?<![\w/.-])((?:configs|gin|tests|t5lite|benchmarks|tpu_scripts)/[\w/.*-]*[\w*])")


def _mentioned_paths():
    for page in PAGES:
        for path in PATH_PATTERN.findall(_text(page)):
            yield page.name, path


def _exists(path: str) -> bool:
    if "*" in path:
        return any(REPO.glob(path))
    target = REPO / path
    # A module may become a package of the same name (t5lite/interop/hf.py -> t5lite/interop/hf/).
    return target.exists() or (path.endswith(".py") and target.with_suffix("").is_dir())


def test_every_path_the_docs_name_exists():
    missing = sorted({f"{page}: {path}" for page, path in _mentioned_paths() if not _exists(path)})
    assert not missing, missing


def test_relative_links_outside_the_site_resolve():
    """README.md and CONTRIBUTING.md link into docs/ and to files; mkdocs checks the links inside docs/."""
    broken = [f"{page.name}: {target}" for page in (README, REPO / "CONTRIBUTING.md")
              for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", _text(page)) if not (REPO / target).exists()]
    assert not broken, broken


def _layout_entries(block: str):
    """(path, line) of a layout picture: two spaces of indent per level; a name ending in / opens a folder."""
    parents: list[tuple[int, str]] = []
    for line in block.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not re.fullmatch(r"[\w.-]+/?", name):
            continue
        indent = len(line) - len(line.lstrip())
        parents = [(i, p) for i, p in parents if i < indent]
        path = "".join(p for _, p in parents) + name
        yield path.rstrip("/"), line
        if name.endswith("/"):
            parents.append((indent, name))


@pytest.mark.parametrize("page", [README, DOCS / "concepts" / "architecture.md"], ids=["README", "architecture"])
def test_layout_picture_matches_the_tree(page):
    block = re.search(r"## Layout\n.*?```text\n(.*?)```", _text(page), re.S).group(1)
    entries = list(_layout_entries(block))
    assert len(entries) >= 10
    missing = [line.strip() for path, line in entries if not _exists(path)]
    assert not missing, missing


def test_architecture_picture_names_every_module():
    block = re.search(r"## Layout\n.*?```text\n(.*?)```", _text(DOCS / "concepts" / "architecture.md"), re.S).group(1)
    named = {path for path, _ in _layout_entries(block)}
    modules = {str(p.relative_to(REPO)) for p in (REPO / "t5lite").rglob("*.py")
               if p.name != "__init__.py" and "tasks" not in p.parent.name}
    unnamed = sorted(m for m in modules if m not in named and str(os.path.dirname(m)) + ".py" not in named)
    assert not unnamed, f"add these to the layout picture: {unnamed}"


def _subparsers():
    parser = cli.build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices


def _flag_mentions():
    """(page, command, flag) for each `--flag` after a `t5lite <command>` in code: code blocks (with
    continuation lines) and inline code spans."""
    command_re = re.compile(rf"\bt5lite ({'|'.join(COMMANDS)})\b(.*)")
    for page in PAGES:
        text = _text(page)
        pieces = [c for block in re.findall(r"```\w*\n(.*?)```", text, re.S) for c in _commands(block)]
        pieces += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        for piece in pieces:
            for match in command_re.finditer(piece):
                for flag in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)(?![\w.])", match.group(2)):
                    if not flag.startswith(("--gin_file", "--gin.")):
                        yield page.name, match.group(1), flag


def test_every_cli_flag_the_docs_mention_exists():
    known = {name: {s for a in sub._actions for s in a.option_strings} for name, sub in _subparsers().items()}
    mentions = list(_flag_mentions())
    assert len(mentions) >= 20
    unknown = sorted({f"{page}: t5lite {cmd} {flag}" for page, cmd, flag in mentions if flag not in known[cmd]})
    assert not unknown, unknown


def test_cli_reference_lists_every_flag():
    text = _text(DOCS / "reference" / "cli.md")
    for name, sub in _subparsers().items():
        section = _section(text, f"`t5lite {name}`")
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help", "--debug"):
                    assert f"`{flag}" in section or f", `{flag}" in section, f"t5lite {name} {flag}"


def _registered_configurables():
    from gin import config
    import t5lite.data.sources  # noqa: F401  (what cli.parse_gin imports to register the configurables)
    import t5lite.experiments.spec  # noqa: F401  (`t5lite sweep`'s)
    import t5lite.infer.predict  # noqa: F401
    import t5lite.train.optimizers  # noqa: F401
    import t5lite.train.partitioning  # noqa: F401
    import t5lite.train.trainer  # noqa: F401
    return {key.split(".")[-1]: value.wrapped for key, value in config._REGISTRY.items()
            if getattr(value.wrapped, "__module__", "").startswith("t5lite")}


def _parameters(fn) -> set[str]:
    target = fn.__init__ if inspect.isclass(fn) else fn
    names = set(inspect.signature(target).parameters)
    if inspect.isclass(fn):   # dataclass-style objectives: their fields
        names |= set(getattr(fn, "__dataclass_fields__", {})) | set(getattr(fn, "__annotations__", {}))
        for base in fn.__mro__:
            names |= set(getattr(base, "__annotations__", {}))
    return names


def test_gin_reference_names_every_configurable():
    text = _text(DOCS / "reference" / "gin.md")
    missing = sorted(name for name in _registered_configurables() if f"`{name}`" not in text)
    assert not missing, missing


def test_every_gin_binding_the_docs_mention_exists():
    """`--gin.NAME.param=...` and `NAME.param = ...` lines name a configurable t5lite registers and one
    of its parameters (macros, in capitals, are checked by the commands that use them)."""
    configurables = _registered_configurables()
    pattern = re.compile(r"(?:--gin\.|^|`)([A-Za-z]\w*)\.(\w+)\s?=", re.M)
    seen, unknown = 0, []
    for page in PAGES:
        for name, param in pattern.findall(_text(page)):
            if name in configurables:
                seen += 1
                if param not in _parameters(configurables[name]):
                    unknown.append(f"{page.name}: {name}.{param}")
            elif name[0].islower() and name not in ("os", "model", "module", "self"):
                unknown.append(f"{page.name}: {name}.{param} (no such configurable)")
    assert seen >= 20 and not unknown, unknown


def test_presets_table_matches_the_code():
    from t5lite.models.config import PRESETS
    rows = re.findall(r"^\| `(\w+)` \| (\w+) \| ([^|]+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|",
                      _text(DOCS / "reference" / "presets.md"), re.M)
    assert sorted(r[0] for r in rows) == sorted(PRESETS)
    for name, arch, _, d_model, heads, d_ff, vocab in rows:
        config = PRESETS[name]()
        assert (arch, int(d_model), int(heads), int(d_ff), int(vocab)) == (
            config.arch, config.d_model, config.num_heads, config.d_ff, config.vocab_size), name


def test_tasks_page_lists_exactly_the_registered_tasks():
    from t5lite.data import catalog
    tasks, mixtures = catalog.names()
    first_column = [line.split("|")[1] for line in _text(DOCS / "reference" / "tasks.md").splitlines()
                    if line.startswith("| `")]
    listed = {name for cell in first_column for name in re.findall(r"`(\w+)`", cell)}
    assert listed == set(tasks) | set(mixtures)


def test_register_task_example_runs():
    from t5lite.data import TaskRegistry, get_task
    code = _code_blocks(_text(DOCS / "guides" / "register-task.md"), "python")[0]
    try:
        exec(compile(code, "register-task.md", "exec"), {})
        dataset = get_task("my_sentiment").get_dataset("train", sequence_length={"inputs": 32, "targets": 4})
        example = next(iter(dataset))
    finally:
        TaskRegistry.remove("my_sentiment")
    assert example["inputs_pretokenized"] == "a fine film" and example["targets_pretokenized"] == "positive"


def test_configs_point_at_no_data_outside_the_user_s_own_flags():
    """Data lives where the user puts it (DATA_DIR): no config or gin piece names a folder beside the checkout."""
    gin_files = [*(REPO / "configs").rglob("*.gin"), *(REPO / "gin").rglob("*.gin")]
    offending = [f"{p.relative_to(REPO)}:{n}" for p in gin_files
                 for n, line in enumerate(_text(p).splitlines(), 1) if "shared/data" in line or "'../" in line]
    assert not offending, offending


# --- the docs speak of the product, not of how it was made ----------------------------------------

HISTORY_WORDS = re.compile(r"\bsession \d|\bsession-\d|\(issue|\bissue \d|\bthe lead\b|\bengineers?\b|throwaway|"
                           r"other jobs|\bload ~|\bload \d|loaded machine|under load|\bgoal\b|used to loop", re.I)


def test_docs_and_code_comments_say_nothing_of_how_the_project_was_made():
    files = [*PAGES, *(REPO / "t5lite").rglob("*.py"), *(REPO / "tests").rglob("*.py"),
             *(REPO / "benchmarks").rglob("*.py"), *(REPO / "configs").rglob("*.gin"), *(REPO / "gin").rglob("*.gin")]
    hits = [f"{f.relative_to(REPO)}: {m.group(0)}" for f in files if f.name != "test_docs.py"
            for m in HISTORY_WORDS.finditer(_text(f))]
    assert not hits, hits

