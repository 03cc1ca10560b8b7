"""Gin for every command: `--gin_file` / `--gin.NAME=VALUE` taken out of argv, parsed with the checks
that name a wrong binding and its fix, and the wiring the entry points share."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from t5lite import gin_checks
from t5lite.cli.inputs import get_task_or_mixture
from t5lite.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
REQUIRED_MACROS = ("MODEL_DIR", "TRAIN_STEPS", "BATCH_SIZE", "TASK_FEATURE_LENGTHS", "MIXTURE_OR_TASK_NAME")
MACROS_READ_BY_NAME = (*REQUIRED_MACROS, "CHECKPOINT_PATH")   # by the commands, whether a binding uses them or not


def split_gin_flags(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Pulls `--gin_file` and `--gin.X=Y` out of argv: (files, bindings, remaining args)."""
    files, bindings, rest = [], [], []
    it = iter(argv)
    for arg in it:
        if arg.startswith("--gin_file"):
            value = arg.split("=", 1)[1] if "=" in arg else next(it, None)
            if value is None:
                raise ConfigError("--gin_file needs a value: --gin_file=configs/local/t5_tiny_pretrain.gin")
            files.extend(v for v in value.split(",") if v)
        elif arg.startswith("--gin."):
            if "=" not in arg:
                raise ConfigError(f"{arg}: write gin bindings as --gin.NAME=VALUE")
            name, value = arg[len("--gin."):].split("=", 1)
            bindings.append(f"{name} = {value}")
        else:
            rest.append(arg)
    return files, bindings, rest


def parse_gin(files: list[str], bindings: list[str], required_macros=REQUIRED_MACROS, entry=None,
              base_file: str | None = None) -> None:
    """Parses gin files and bindings; a misspelled name, a missing macro or a value of the wrong
    type fails here, naming the binding and the fix.

    `entry` (gin name, function) adds the macros that entry point's bindings refer to to the
    required ones and checks the bound values against the type hints of it and of every other bound
    configurable; `base_file` is read before `files` (the eval / infer wiring). A macro that nothing
    uses is refused (a misspelling would otherwise be ignored).
    """
    import gin
    import t5lite.data.sources  # noqa: F401  (registers configurables)
    import t5lite.infer.embedding  # noqa: F401
    import t5lite.infer.predict  # noqa: F401
    import t5lite.train.optimizers  # noqa: F401
    import t5lite.train.partitioning  # noqa: F401
    import t5lite.train.trainer  # noqa: F401
    search_paths = (os.getcwd(), str(REPO_ROOT))
    for path in search_paths:
        gin.add_config_file_search_path(path)
    logging.getLogger().addFilter(_quiet_gin_search)
    if not files and base_file is None:
        raise ConfigError("no --gin_file given; try --gin_file=configs/local/t5_tiny_pretrain.gin")
    # The repository's own configs by absolute path: from another folder, gin would look for
    # `configs/local/x.gin` in a Python package `configs.local` first and fail on it.
    files = [str(REPO_ROOT / f) if not os.path.exists(f) and (REPO_ROOT / f).is_file() else f for f in files]
    gin_checks.check_includes(files, search_paths)
    try:
        gin.parse_config_files_and_bindings(([base_file] if base_file else []) + files, None,
                                            finalize_config=False)
    except (ValueError, IOError, SyntaxError) as e:
        message = ' '.join(line.strip() for line in str(e).splitlines())
        hint = gin_checks.unknown_configurable_hint(message)
        raise ConfigError(f"gin file error: {message}" + (f". {hint}" if hint else "")) from e
    for binding in bindings:
        _parse_binding(binding)
    gin_checks.check_macros_used(MACROS_READ_BY_NAME, bindings, ([base_file] if base_file else []) + files,
                                 search_paths)
    required = list(required_macros) + (gin_checks.referenced_macros(*entry) if entry else [])
    missing = list(dict.fromkeys(m for m in required if not gin_checks.macro_defined(m)))
    if missing:   # a macro defaulting to another (CHECKPOINT_PATH = %MODEL_DIR) takes either
        hint = " ".join(" or ".join(f"--gin.{m}=..." for m in gin_checks.macro_chain(name)) for name in missing)
        raise ConfigError(f"missing required gin macro(s) {', '.join(missing)}: set them in a gin file or with {hint}")
    if entry:   # `compile` binds placeholders (MODEL_DIR = None) and runs no entry point
        gin_checks.check_bound_types(entry)


def _quiet_gin_search(record: logging.LogRecord) -> bool:
    """Drops gin's log line for every search path an include is not in ("ERROR ... Path not found"):
    an include found in a later search path is not an error."""
    return not record.pathname.endswith(os.path.join("gin", "resource_reader.py"))


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _parse_binding(binding: str) -> None:
    """One `--gin.NAME=VALUE` binding; a parse error names it and shows the quoting rule."""
    import gin
    name, value = (part.strip() for part in binding.split("=", 1))
    try:
        gin.parse_config(binding)
    except SyntaxError:
        unquoted = value.strip("'\"")
        raise ConfigError(f"--gin.{name}={value}: gin cannot parse the value {value!r}; values are Python literals, "
                          f"so a string needs inner quotes: --gin.{name}=\"'{unquoted}'\"") from None
    except ValueError as e:
        hint = gin_checks.unknown_configurable_hint(str(e))
        raise ConfigError(f"--gin.{name}={value}: {_first_line(e)} {hint}".rstrip()) from e


def check_task_name(entry: str) -> None:
    """Looks up the task the entry point will run, so an unknown name fails before any work."""
    name = gin_checks.bound_value(f"{entry}.mixture_or_task_name")
    if name is not None:   # unbound: the entry point names the missing argument
        get_task_or_mixture(name)


def model_from_run_unless_given(entry: str) -> None:
    """Without a model gin (no `model_config.preset`), `entry` reads the run's model_config.json."""
    import gin
    if not gin_checks.is_bound("model_config.preset"):
        gin.bind_parameter(f"{entry}.model", None)


def from_training_config(entry: str = "eval", names: tuple[str, ...] = ("objective",)) -> None:
    """A training config's `train.objective` (a task head, say) is what `t5lite eval` evaluates
    (and `t5lite embed` embeds) with, so the model is built and scored as during training; the
    same for the other `names` (`t5lite eval`: `data_dir`, so a config that binds only
    `train.data_dir` reads its evaluation data from the same folder). `<entry>.<name>` given wins."""
    import gin
    for name in names:
        if gin_checks.is_bound(f"train.{name}") and not gin_checks.is_bound(f"{entry}.{name}"):
            gin.bind_parameter(f"{entry}.{name}", gin.query_parameter(f"train.{name}"))
