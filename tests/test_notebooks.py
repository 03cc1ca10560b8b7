"""The lecture companions in notebooks/: jupytext percent scripts that open as notebooks.

The fast test checks each one's shape (a title, the one pip line Colab needs, asserts of its own);
the slow test executes each one top to bottom in a Jupyter kernel, as a student would."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext", reason="reads the percent scripts as notebooks (the notebooks extra)")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.py"))
PIP_LINE = '%pip install -q "t5lite[notebooks]" --find-links .'


def _code(cell) -> str:
    """A code cell as Python: IPython magics (the pip line) left out."""
    return "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_theme.py found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_title_pip_line_and_asserts(path):
    notebook = jupytext.read(path)
    title, install, *rest = notebook.cells
    assert title.cell_type == "markdown" and title.source.startswith("# "), "the first cell is the title"
    assert install.cell_type == "code" and install.source.strip() == PIP_LINE, "the second cell is the pip line"
    code = "\n".join(_code(c) for c in rest if c.cell_type == "code")
    tree = ast.parse(code, filename=str(path))
    assert any(isinstance(node, ast.Assert) for node in ast.walk(tree)), "a notebook asserts its results"
    assert "plt.show()" in code, "a notebook shows at least one plot"
    assert "/shared" not in path.read_text(), "notebooks get their own data"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path):
    """Executed in a fresh kernel, as Jupyter runs it; any failing cell (an assert included) fails it."""
    nbclient = pytest.importorskip("nbclient", reason="runs the notebooks in a kernel (the notebooks extra)")
    notebook = jupytext.read(path)
    # A cell's limit, not the notebook's: a training cell takes minutes, more on a busy machine.
    nbclient.NotebookClient(notebook, timeout=1800, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the plots were shown"
