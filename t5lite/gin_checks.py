"""Checks of a gin config that gin itself does not make, so a mistake fails before any work: an
`include` of a missing file or in a cycle, a macro bound but used by nothing (a misspelling,
silently ignored otherwise) and a literal value whose type does not fit the parameter it reaches.

Gin keeps its bindings in `gin.config._CONFIG` ({(scope, selector): {parameter: value}}); these
checks read that table, since gin has no public way to list every binding.
"""
from __future__ import annotations

import collections.abc
import difflib
import inspect
import re
import types
import typing
from pathlib import Path

from t5lite.errors import ConfigError

_MACRO = "gin.macro"


def _bindings() -> dict:
    import gin.config
    return gin.config._CONFIG


def _macro_references(value) -> typing.Iterator[str]:
    """The macro names a bound value refers to (`%NAME`), however deeply nested."""
    import gin
    if isinstance(value, gin.config.ConfigurableReference):
        if value.scoped_selector.endswith("/" + _MACRO):
            yield value.scoped_selector.split("/")[0]
    elif isinstance(value, collections.abc.Mapping):
        for item in (*value.keys(), *value.values()):
            yield from _macro_references(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _macro_references(item)


def check_macros_used(read_by_name: typing.Iterable[str], cli_bindings: typing.Sequence[str] = (),
                      files: typing.Sequence[str] = (), search_paths: typing.Sequence[str] = ()) -> None:
    """Refuses a macro that is bound but that no binding refers to and no entry point reads by name
    (`read_by_name`): `--gin.TRAIN_STEP=3` would otherwise be ignored and the run go on with the
    config's TRAIN_STEPS. The message names where it was bound and the known macros closest to it."""
    config = _bindings()
    defined = [scope for scope, selector in config if selector == _MACRO]
    used = set(read_by_name)
    for values in config.values():
        for value in values.values():
            used.update(_macro_references(value))
    unused = [name for name in defined if name not in used]
    if not unused:
        return
    name = unused[0]
    from_cli = {binding.split("=", 1)[0].strip() for binding in cli_bindings}
    where = (f"--gin.{name}" if name in from_cli else
             f"gin macro {name} (set in {_file_binding(name, files, search_paths)})")
    close = difflib.get_close_matches(name, sorted(used), n=3, cutoff=0.6)
    hint = (f"did you mean {' or '.join(close)}?" if close else
            f"the macros this config uses are {', '.join(sorted(used))}")
    more = f" (also unused: {', '.join(unused[1:])})" if len(unused) > 1 else ""
    raise ConfigError(f"{where} is set but nothing in the config uses it{more}; {hint}")


def _file_binding(name: str, files: typing.Sequence[str], search_paths: typing.Sequence[str]) -> str:
    """The gin file (among `files` and the files they include) whose line binds macro `name`."""
    pattern = re.compile(rf"^\s*{re.escape(name)}\s*=", re.M)
    seen, todo = set(), list(files)
    while todo:
        path = _find(todo.pop(0), search_paths)
        if path is None or path in seen:
            continue
        seen.add(path)
        text = path.read_text(encoding="utf-8", errors="replace")
        if pattern.search(text):
            return str(path)
        todo.extend(included for _, included in _includes(text))
    return "a gin file"


_INCLUDE = re.compile(r"^[ \t]*include\s+['\"]([^'\"]+)['\"]", re.M)


def _includes(text: str) -> typing.Iterator[tuple[int, str]]:
    """(line number, included name) of each `include` line of a gin file's text."""
    for match in _INCLUDE.finditer(text):
        yield text.count("\n", 0, match.start()) + 1, match.group(1)


def check_includes(files: typing.Sequence[str], search_paths: typing.Sequence[str]) -> None:
    """Refuses an `include` that gin would fail on at length or with a traceback: a file found in
    no search path, and a file that includes itself back (gin recurses until Python gives up).
    The message names the including file and line. Remote includes (gs://...) are gin's to read."""
    def visit(path: Path, chain: tuple[Path, ...]) -> None:
        for line, name in _includes(path.read_text(encoding="utf-8", errors="replace")):
            if "://" in name:
                continue
            found = _find(name, search_paths)
            if found is None:
                raise ConfigError(f"{path}: line {line}: include '{name}' is found in none of "
                                  f"{', '.join(dict.fromkeys(search_paths))}; fix the path or remove the line")
            if found in chain:
                cycle = " -> ".join(p.name for p in (*chain[chain.index(found):], found))
                raise ConfigError(f"{path}: line {line}: include '{name}' makes a cycle ({cycle}); remove it")
            visit(found, (*chain, found))

    for name in files:
        found = _find(name, search_paths)
        if found is not None:
            visit(found, (found,))


def _find(name: str, search_paths: typing.Sequence[str]) -> Path | None:
    for base in ("", *search_paths):
        path = Path(base, name)
        if path.is_file():
            return path.resolve()
    return None


# --- literal values against the type hints of the parameters they are bound to.

_EXAMPLES = {int: "100", float: "0.5", bool: "True", str: "\"'text'\""}


def check_bound_types(first: tuple[str, typing.Callable] | None = None) -> None:
    """Checks every literal value bound to a configurable's parameter (directly or through a macro)
    against the parameter's type hint, so `--gin.TRAIN_STEPS="'5'"` fails here rather than deep
    inside the run; `first` (gin name, function), the entry point, is checked before the rest."""
    import gin.config
    targets = {first[0]: (first[0], first[1])} if first else {}   # name: (selector, function)
    for scope, selector in list(_bindings()):
        configurable = gin.config._REGISTRY.get(selector) if selector != _MACRO else None
        if configurable is not None:
            fn = configurable.wrapped
            prefix = f"{scope}/" if scope else ""
            targets.setdefault(prefix + configurable.name,
                               (prefix + selector, fn.__init__ if inspect.isclass(fn) else fn))
    for name, (selector, fn) in targets.items():
        _check_configurable(name, selector, fn)


def _check_configurable(name: str, selector: str, fn) -> None:
    import gin
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):
        return
    for param, hint in hints.items():
        try:
            value = gin.query_parameter(f"{selector}.{param}")
        except ValueError:
            continue
        flag = f"--gin.{name}.{param}"
        while isinstance(value, gin.config.ConfigurableReference):
            reference = value.scoped_selector
            if not reference.endswith("/" + _MACRO):
                break
            flag = f"--gin.{reference.split('/')[0]}"
            try:
                value = gin.query_parameter(f"%{reference.split('/')[0]}")
            except ValueError:  # an undefined macro: gin names it when the entry point runs
                break
        if isinstance(value, gin.config.ConfigurableReference) or _matches(value, hint):
            continue
        raise ConfigError(f"{flag} is {value!r} ({type(value).__name__}), but {name}.{param} takes "
                          f"{_type_name(hint)}: e.g. {flag}={_example(hint)}")


def _matches(value, hint) -> bool:
    """Whether `value` fits `hint`; kinds of hint it does not know pass (the check only catches sure mistakes)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (dict, collections.abc.Mapping):
        key, item = args or (object, object)
        return isinstance(value, collections.abc.Mapping) and all(
            _matches(k, key) and _matches(v, item) for k, v in value.items())
    if hint in (str, bool):
        return isinstance(value, hint)
    return True


def _type_name(hint) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is not None:
        return str(hint).replace("typing.", "")
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _example(hint) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return _example(typing.get_args(hint)[0])
    if typing.get_origin(hint) in (dict, collections.abc.Mapping):
        return "\"{'inputs': 128, 'targets': 32}\""
    return _EXAMPLES.get(hint, "...")


def unknown_configurable_hint(message: str) -> str:
    """For gin's "No configurable matching 'NAME'.": what NAME may mean, as a sentence (a
    dotted NAME whose module path is not the configurable's: its short name, which every config
    uses; a misspelling: the closest names); '' for any other message."""
    from gin import config
    match = re.search(r"No configurable matching '([\w.]+)'", message)
    if not match:
        return ""
    selector = match.group(1)
    wanted = selector.split(".")[-1]
    names = sorted({key.split(".")[-1] for key, _ in config._REGISTRY.items()})
    if "." in selector and wanted in names:
        return f"Write it as {wanted}: gin's short name needs no module path."
    close = difflib.get_close_matches(wanted, names, n=3)
    return f"Did you mean {' or '.join(close)}?" if close else ""


def referenced_macros(name: str, fn) -> list[str]:
    """The macros `name.<parameter> = %MACRO` bindings of an entry point refer to."""
    import gin
    found = []
    for param in inspect.signature(fn).parameters:
        try:
            value = gin.query_parameter(f"{name}.{param}")
        except ValueError:
            continue
        selector = getattr(value, "scoped_selector", "")
        if selector.endswith("/gin.macro"):
            found.append(selector.split("/")[0])
    return found


def macro_chain(name: str) -> list[str]:
    """`name` and the macros it is bound to in turn (gin/eval.gin: CHECKPOINT_PATH -> MODEL_DIR)."""
    import gin
    chain = [name]
    while is_bound(f"%{chain[-1]}") and len(chain) < 10:
        selector = getattr(gin.query_parameter(f"%{chain[-1]}"), "scoped_selector", "")
        if not selector.endswith("/gin.macro"):
            break
        chain.append(selector.split("/")[0])
    return chain


def macro_defined(name: str) -> bool:
    """Bound to a value, directly or through other macros."""
    return is_bound(f"%{macro_chain(name)[-1]}")


def is_bound(name: str) -> bool:
    """A gin parameter or macro (`%NAME`) has a value."""
    import gin
    try:
        gin.query_parameter(name)
        return True
    except ValueError:
        return False


def bound_value(name: str, default=None):
    """What a gin parameter is bound to, followed through macros (`train.eval_split = %SPLIT`); `default`
    where it is unbound."""
    import gin
    try:
        value = gin.query_parameter(name)
    except ValueError:
        return default
    while isinstance(value, gin.config.ConfigurableReference) and value.scoped_selector.endswith("/" + _MACRO):
        value = gin.query_parameter(f"%{value.scoped_selector.split('/')[0]}")
    return value
