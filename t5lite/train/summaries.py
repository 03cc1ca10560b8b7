"""Where training metrics go: `metrics.jsonl`, TensorBoard events, and a PNG loss curve, in a
local MODEL_DIR or a gs:// one."""
from __future__ import annotations

import io
import json
import os

import jax
from etils import epath

from t5lite import finite, storage
from t5lite.run_layout import RunDir


class MetricsWriter:
    """Writes from the first host only; resuming drops logged steps past the restored checkpoint."""

    def __init__(self, model_dir: str, resume_step: int = 0):
        self.active = jax.process_index() == 0
        run = RunDir(model_dir)
        self.path = str(run.metrics)
        self._tb = None
        if not self.active:
            return
        file = epath.Path(self.path)
        if file.exists():
            kept = [line + "\n" for line in file.read_text(encoding="utf-8").splitlines()
                    if line.strip() and json.loads(line)["step"] <= resume_step]
            file.write_text("".join(kept), encoding="utf-8")
        from tensorboardX import SummaryWriter, record_writer
        record_writer.register_writer_factory("gs", _EpathEventFiles())
        self._tb = SummaryWriter(str(run.tensorboard))

    def write(self, step: int, metrics: dict) -> None:
        """One line per logged step; a NaN or infinite value is null there, flagged under "non_finite"."""
        if not self.active:
            return
        record = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
        storage.append_text(self.path, finite.dumps(finite.flag_non_finite(record)) + "\n")
        for key, value in metrics.items():
            self._tb.add_scalar(key, float(value), int(step))
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


class _EpathEventFile:
    """A gs:// TensorBoard event file written through etils.epath, like every other file of a run
    (one storage client, one set of credentials; tensorboardX's own would need
    google-cloud-storage). An object can't be appended to, so each flush uploads the whole file."""

    def __init__(self, path: str):
        self.path, self.buffer = epath.Path(path), io.BytesIO()

    def write(self, data: bytes) -> None:
        self.buffer.write(data)

    def flush(self) -> None:
        self.path.write_bytes(self.buffer.getvalue())

    def close(self) -> None:
        self.flush()


class _EpathEventFiles:
    """tensorboardX's writer factory for a URL scheme (`record_writer.register_writer_factory`)."""

    def open(self, path: str) -> _EpathEventFile:
        return _EpathEventFile(path)

    def directory_check(self, path: str) -> None:
        """Cloud folders need no creating."""


def read_metrics(path: str) -> list[dict]:
    """metrics.jsonl's records as logged (a value flagged non-finite back as NaN or infinity); a line
    cut short by a kill is left out."""
    records = []
    for line in epath.Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(finite.unflag_non_finite(json.loads(line)))
        except ValueError:
            continue
    return records


def plot_loss_curve(metrics_path: str, out_path: str) -> str:
    """A PNG of loss (and eval loss, if logged) against step; for a language model that logs
    perplexity (the recurrent LMs), `perplexity.png` beside it too."""
    records = read_metrics(metrics_path)
    title = os.path.basename(os.path.dirname(storage.absolute(metrics_path))) or "training"
    _plot(records, ("loss", "eval_loss"), "cross entropy per target token", title, out_path)
    if any("perplexity" in r for r in records):
        _plot(records, ("perplexity", "eval_perplexity", "eval_forward_perplexity", "eval_backward_perplexity"),
              "perplexity", title, RunDir(epath.Path(out_path).parent).perplexity_plot)
    return out_path


def _plot(records: list[dict], keys, ylabel: str, title: str, out_path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key in keys:
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            ax.plot(*zip(*points), marker="." if len(points) < 50 else None, label=key)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    epath.Path(out_path).write_bytes(png.getvalue())
