"""Run lecture companions top to bottom and write each, with its outputs, as a page of the docs site.

    python notebooks/render.py 04_finetuning_and_peft 05_bertology

executes notebooks/NAME.py in a Jupyter kernel (as the slow test does, from a scratch folder) and
writes docs/notebooks/NAME.md: the text cells as they are, each code cell in a python block, its
printed output in a text block, its figures as PNG files beside the page. The docs build reads
the pages as committed and runs nothing; tests/test_notebooks.py checks that each page's code is
its notebook's code, so a notebook edited without re-rendering fails the fast suite.

The scratch folder is also the kernel's temporary folder: the runs a notebook leaves there for the
next notebook to reuse are trained afresh, so each page shows its own training log.
"""
from __future__ import annotations

import argparse
import base64
import datetime
import os
import re
import tempfile
from pathlib import Path

import jupytext
import nbclient

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "notebooks"
ANSI = re.compile(r"\x1b\[[0-9;]*m")   # terminal colours (pip's warnings), which a page cannot show
# tqdm.auto, imported by t5lite's progress bars, warns in a kernel without ipywidgets (Colab has them)
# that it falls back to text bars; that one warning is left off the pages.
NO_WIDGETS_WARNING = "ignore:IProgress not found"
# IPython's %pip prints this after every install, whether or not the kernel had imported the package;
# the install cell runs before anything is imported, so no restart is needed and the line is left off.
RESTART_NOTE = "Note: you may need to restart the kernel to use updated packages."


def _outputs(cell, name: str, figures: list[Path], scratch: str) -> list[str]:
    """A code cell's outputs as markdown: text blocks and figure links (the PNGs written). Paths in the
    scratch folder read `$TMPDIR/...`, the kernel's temporary folder, not one render's random name."""
    parts = []
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if "image/png" in data:
            figure = PAGES / f"{name}_{len(figures) + 1}.png"
            figure.write_bytes(base64.b64decode(data["image/png"]))
            figures.append(figure)
            parts.append(f"![figure {len(figures)} of {name}]({figure.name})")
        else:
            text = ANSI.sub("", output.get("text") or data.get("text/plain", ""))
            text = text.replace(RESTART_NOTE, "").replace(scratch, "$TMPDIR")
            if text.strip():
                parts.append(f"```text\n{text.rstrip()}\n```")
    return parts


def _kernel_env(scratch: str) -> dict[str, str]:
    """The kernel's environment: this one, with the scratch folder as its temporary folder, the CPU as
    JAX's platform unless JAX_PLATFORMS says otherwise (the pages are CPU runs; an installed libtpu
    would otherwise print its failed TPU search into the first cell that uses JAX) and tqdm's
    no-widgets warning filtered."""
    warnings = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), NO_WIDGETS_WARNING]))
    return {**os.environ, "TMPDIR": scratch, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
            "PYTHONWARNINGS": warnings}


def render(name: str) -> Path:
    """Execute notebooks/NAME.py and write docs/notebooks/NAME.md; returns the page."""
    notebook = jupytext.read(ROOT / "notebooks" / f"{name}.py")
    with tempfile.TemporaryDirectory() as scratch:
        # coalesce_streams: a cell's printed lines in one block, not cut where the kernel flushed them.
        nbclient.NotebookClient(notebook, timeout=1800, kernel_name="python3", coalesce_streams=True,
                                resources={"metadata": {"path": scratch}}).execute(env=_kernel_env(scratch))
    PAGES.mkdir(parents=True, exist_ok=True)
    for old in PAGES.glob(f"{name}_*.png"):
        old.unlink()
    figures: list[Path] = []
    title, *cells = notebook.cells
    parts = [title.source, f"*The notebook `notebooks/{name}.py` as run top to bottom on a 2-core CPU on "
                           f"{datetime.date.today().isoformat()} by `python notebooks/render.py {name}`, "
                           "with the outputs it printed and the figures it showed.*"]
    for cell in cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source)
        else:
            parts.append(f"```python\n{cell.source}\n```")
            parts.extend(_outputs(cell, name, figures, scratch))
    page = PAGES / f"{name}.md"
    page.write_text("\n\n".join(parts) + "\n")
    return page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", help="notebooks to render, e.g. 04_finetuning_and_peft")
    for name in parser.parse_args().names:
        print("wrote", render(name.removesuffix(".py")).relative_to(ROOT))


if __name__ == "__main__":
    main()
