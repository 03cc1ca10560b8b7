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


PERPLEXITY_KEYS = ("perplexity", "eval_perplexity", "eval_forward_perplexity", "eval_backward_perplexity")


def plot_loss_curve(metrics_path: str, out_path: str, loss_label: str = "loss", split: str = "dev") -> str:
    """A PNG of loss (and eval loss, if logged) against step, with the evaluated `split`'s metrics
    below it (named as the console names it) when the run evaluated; `loss_label` says what the loss
    is a mean over (the objective's `loss_label`, t5lite.objectives.base).
    For a language model that logs perplexity (the recurrent LMs), `perplexity.png` beside it too."""
    records = read_metrics(metrics_path)
    title = os.path.basename(os.path.dirname(storage.absolute(metrics_path))) or "training"
    _save(loss_figure(records, loss_label, title, split), out_path)
    if any("perplexity" in r for r in records):
        _save(curves_figure(records, [(PERPLEXITY_KEYS, "perplexity")], title),
              RunDir(epath.Path(out_path).parent).perplexity_plot)
    return out_path


def loss_figure(records: list[dict], loss_label: str, title: str, split: str = "dev"):
    """The figure of loss.png: the loss panel, and a panel of the evaluated split's metrics (`eval_*`
    in t5lite's units, accuracy in %) when the run evaluated."""
    panels = [(("loss", "eval_loss"), loss_label)]
    dev = dev_metric_keys(records)
    if dev:
        panels.append((dev, f"{split} metric"))
    return curves_figure(records, panels, title)


def dev_metric_keys(records: list[dict]) -> tuple[str, ...]:
    """The logged `eval_*` metrics other than the loss and perplexities (those have their own plots),
    in the order first logged."""
    keys = dict.fromkeys(k for r in records for k in r if k.startswith("eval_"))
    return tuple(k for k in keys if k != "eval_loss" and k not in PERPLEXITY_KEYS)


def curves_figure(records: list[dict], panels, title: str):
    """One panel per (metric keys, y label), stacked over a shared step axis. A panel whose values
    span more than a factor of 10 is on a log scale; every tick label is a plain decimal."""
    from t5lite.plotting import plain_ticks, pyplot

    fig, axes = pyplot().subplots(len(panels), 1, figsize=(7, 2.6 + 1.8 * len(panels)), sharex=True, squeeze=False)
    for ax, (keys, ylabel) in zip(axes[:, 0], panels):
        values = []
        for key in keys:
            points = [(r["step"], r[key]) for r in records if key in r]
            if points:
                ax.plot(*zip(*points), marker="." if len(points) < 50 else None, label=key)
                values += [v for _, v in points]
        positive = [v for v in values if v > 0]
        if positive and len(positive) == len(values) and max(positive) > 10 * min(positive):
            ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        plain_ticks(ax, integer_x=True)
    axes[0, 0].set_title(title)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    return fig


def _save(fig, out_path) -> None:
    """The figure as a PNG at a local path or gs:// URL."""
    from t5lite.plotting import pyplot
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    pyplot().close(fig)
    epath.Path(out_path).write_bytes(png.getvalue())
