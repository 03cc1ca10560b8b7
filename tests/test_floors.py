"""The floors of the house (DESIGN.md): cli -> experiments, analysis -> interop -> train -> objectives ->
infer -> data -> models, metrics; a module never imports from a higher floor, not even inside a function."""
import ast
import pathlib

import t5lite

PACKAGE = pathlib.Path(t5lite.__file__).parent
# Top-level helper modules (errors, metrics, platforms, writable, xla_flags) sit on the ground floor.
FLOORS = {"cli": 7, "experiments": 6, "analysis": 6, "interop": 5, "train": 4, "objectives": 3, "infer": 2, "data": 1}


def floor(module: str) -> int:
    """The floor of a dotted t5lite module name."""
    parts = module.split(".")
    return FLOORS.get(parts[1], 0) if len(parts) > 1 else 0


def imported_modules(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "t5lite":   # `from t5lite import models, metrics`
                yield from (f"t5lite.{alias.name}" for alias in node.names)
            else:
                yield node.module


def test_no_module_imports_from_a_higher_floor():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(("t5lite", *path.relative_to(PACKAGE).with_suffix("").parts))
        for target in imported_modules(path):
            if target.startswith("t5lite.") and floor(target) > floor(name):
                upward.append(f"{name} imports {target}")
    assert not upward, "imports that go up a floor:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    """The walk finds imports inside functions, so the test above can fail."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from t5lite.train import checkpoints\n")
    assert "t5lite.train" in list(imported_modules(module))
    assert floor("t5lite.train.checkpoints") > floor("t5lite.objectives.base") > floor("t5lite.infer.predict")


def module_name(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> str:
    """The dotted name of a module file; a package's __init__.py is the package."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at the top or inside a function). `from p import
    name` counts as importing p.name when that is a module, else p; a submodule's implicit import of
    its parent packages is not an edge (every module would sit in a circle with its package)."""
    modules = {module_name(path, root): path for path in root.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
                module = ".".join(p for p in (base, node.module) if p)
                targets.update(f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module
                               for a in node.names)
        edges = set()
        for target in targets:
            while target and target not in modules:      # `import t5lite.data.vocab.X` -> its module
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports as [a, b, ..., a], or None (depth-first search, colouring the nodes)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "an import circle: " + " -> ".join(cycle) + \
        " (move the piece they share into a lower module with that one job)"


def test_the_check_sees_an_import_circle(tmp_path):
    """A circle through an import inside a function, and through `from pkg import module`."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.c import g\n")
    (package / "c.py").write_text("import pkg.a\ndef g():\n    pass\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    (package / "c.py").write_text("def g():\n    pass\n")
    assert find_cycle(import_graph(package)) is None
