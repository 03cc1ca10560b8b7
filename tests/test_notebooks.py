"""The lecture companions in notebooks/: jupytext percent scripts that open as notebooks.

The fast test checks each one's shape (a title, the one pip line Colab needs, asserts of its own);
the slow test executes each one top to bottom in a Jupyter kernel, as a student would."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import shared_data_dir

jupytext = pytest.importorskip("jupytext", reason="reads the percent scripts as notebooks (the notebooks extra)")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.py"))
PIP_LINE = '%pip install -q "t5lite[notebooks]" --find-links .'
PAGES = sorted((Path(__file__).resolve().parents[1] / "docs" / "notebooks").glob("*.md"))


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


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_rendered_page_is_its_notebook(page):
    """A docs page written by notebooks/render.py shows its notebook's current cells, and its figures exist."""
    notebook = jupytext.read(page.parents[2] / "notebooks" / f"{page.stem}.py")
    text = page.read_text()
    code = [c.source for c in notebook.cells if c.cell_type == "code"]
    rerender = f"the notebook changed since its page was written: python notebooks/render.py {page.stem}"
    assert re.findall(r"^```python\n(.*?)\n```$", text, flags=re.S | re.M) == code, rerender
    assert all(c.source in text for c in notebook.cells if c.cell_type == "markdown"), rerender
    figures = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", text)
    assert figures and all((page.parent / f).is_file() for f in figures), "a page shows its notebook's figures"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_rendered_page_shows_no_warnings(page):
    """What a page shows a student printed is the notebook's own output: no warning, error or
    traceback of the machine that rendered it (a stale install, a TPU search, a missing widget), no
    advice to restart a kernel that never needs it, no random temporary folder of one render."""
    outputs = "\n".join(re.findall(r"^```text\n(.*?)\n```$", page.read_text(), flags=re.S | re.M))
    noise = re.findall(r"^.*(?:Warning|WARNING|Traceback|\bE0000\b|restart the kernel|/tmp[a-z0-9_]{8}/).*$",
                       outputs, flags=re.M)
    assert not noise, f"render it again with a clean environment: python notebooks/render.py {page.stem}: {noise[:3]}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    """Executed in a fresh kernel, as Jupyter runs it; any failing cell (an assert included) fails it."""
    nbclient = pytest.importorskip("nbclient", reason="runs the notebooks in a kernel (the notebooks extra)")
    # The data a notebook would otherwise download (the kernel inherits the environment): GLUE's
    # SST-2, UD English-EWT, and allennlp's small test biLM in place of the released ELMo.
    shared = shared_data_dir()
    monkeypatch.setenv("GLUE_DIR", str(shared / "glue"))
    monkeypatch.setenv("UD", str(shared / "ud"))
    monkeypatch.setenv("ELMO_OPTIONS", str(shared / "elmo" / "options.json"))
    monkeypatch.setenv("ELMO_WEIGHTS", str(shared / "elmo" / "lm_weights.hdf5"))
    notebook = jupytext.read(path)
    # A cell's limit, not the notebook's: a training cell takes minutes, more on a busy machine.
    nbclient.NotebookClient(notebook, timeout=1800, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the plots were shown"
