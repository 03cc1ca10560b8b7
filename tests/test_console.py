"""What `t5lite train` prints: the dev metric at each evaluation (a line and the progress bar), the
training numbers labelled `train`, the --verbose / --quiet split, and loss.png's panels and ticks."""
import json
import re

import gin
import pytest

from conftest import REPO, shared_data_dir
from t5lite import cli
from t5lite.train import summaries

SST2 = REPO / "configs/local/bert_tiny_finetune_sst2.gin"
EVAL_EXAMPLES = 16
DEV_LINE = re.compile(r"^step (\d+) dev: accuracy=(\S+) \((\d+) examples\)$")
PLAIN_DECIMAL = re.compile(r"^[-−]?\d+(\.\d+)?$")   # matplotlib writes U+2212 for a minus


def train_sst2(tmp_path, capsys, caplog, *flags):
    """bert_tiny on SST-2 for 2 steps, evaluated at step 2 on 16 dev examples, through the CLI: (stdout,
    stderr, the t5lite log lines, the run's metrics.jsonl records)."""
    run = tmp_path / "run"
    try:
        cli.main(["train", *flags, f"--gin_file={SST2}", f"--gin.MODEL_DIR='{run}'", "--gin.INITIAL_CHECKPOINT_PATH=None",
                  f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'", "--gin.TRAIN_STEPS=2", "--gin.EVAL_EVERY=2",
                  "--gin.BATCH_SIZE=8", "--gin.train.log_every=1", f"--gin.train.eval_max_examples={EVAL_EXAMPLES}"])
    finally:
        gin.clear_config()
    out, err = capsys.readouterr()
    logged = [(r.name, r.getMessage()) for r in caplog.records if r.name.startswith("t5lite")]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return out, err, logged, records


def final_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("final: "))


def test_the_default_console_prints_the_dev_metric_and_labels_the_training_numbers(tmp_path, capsys, caplog,
                                                                                     monkeypatch):
    figures = []
    monkeypatch.setattr(summaries, "loss_figure", lambda *a, build=summaries.loss_figure: figures.append(build(*a))
                        or figures[-1])
    out, err, logged, records = train_sst2(tmp_path, capsys, caplog)
    dev_lines = [DEV_LINE.match(message) for name, message in logged if name == "t5lite.events" and "dev" in message]
    assert len(dev_lines) == 1 and dev_lines[0], logged
    step, printed, examples = dev_lines[0].groups()
    logged_value = next(r["eval_accuracy"] for r in records if "eval_accuracy" in r and r["step"] == int(step))
    assert float(printed) == pytest.approx(logged_value, rel=5e-4)   # the line's 4 significant digits
    assert int(examples) == EVAL_EXAMPLES
    bar = err.rsplit("\r", 1)[-1]
    assert "train_acc=" in bar and "lr=" in bar and f"dev_accuracy={printed}" in bar, bar
    final = final_line(out)
    assert final.startswith("final: train ") and f"| dev accuracy={printed}" in final
    for shown in ("loss=", "learning_rate=", "examples_per_sec=", "tokens_per_sec="):
        assert shown in final
    for hidden in ("mfu=", "z_loss=", "cost_"):
        assert hidden not in final
    assert not any(name == "t5lite.cost" for name, _ in logged)
    assert {"padded_mfu", "mfu", "cost_usd", "cost_co2e_kg"} <= set(records[-2])   # metrics.jsonl keeps them
    (figure,) = figures   # loss.png: the classifier's loss is per example, the dev accuracy below it
    assert [ax.get_ylabel() for ax in figure.axes] == ["loss per example", "dev metric"]


def test_verbose_adds_utilisation_and_cost(tmp_path, capsys, caplog):
    out, _, logged, _ = train_sst2(tmp_path, capsys, caplog, "--verbose")
    final = final_line(out)
    assert "padded_mfu=" in final and " mfu=" in final and "cost_usd=" in final and "cost_co2e_kg=" in final
    assert any(name == "t5lite.cost" and "kg CO2e" in message and "$" in message for name, message in logged)


def test_quiet_prints_only_evaluations_saves_and_the_end(tmp_path, capsys, caplog):
    out, err, logged, _ = train_sst2(tmp_path, capsys, caplog, "--quiet")
    assert "step/s" not in err and "train_acc" not in err   # no progress bar
    assert {name for name, _ in logged} == {"t5lite.events"}, logged
    assert sum(bool(DEV_LINE.match(message)) for _, message in logged) == 1
    assert any("saved a checkpoint" in message for _, message in logged)
    assert final_line(out) and "model dir:" in out


def test_verbose_and_quiet_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--verbose", "--quiet", f"--gin_file={SST2}"])
    assert exited.value.code == 2 and "--quiet: not allowed with argument --verbose" in capsys.readouterr().err


def plain_tick_labels(figure) -> list[str]:
    figure.canvas.draw()
    return [label.get_text() for ax in figure.axes for axis in (ax.xaxis, ax.yaxis)
            for label in axis.get_ticklabels(which="both") if label.get_text()]


# A loss that barely moves (0.6948 -> 0.6828: a log axis would label it 6.92×10⁻¹) and two evaluations.
RECORDS = [{"step": s, "loss": 0.6948 - 0.0006 * s} for s in range(1, 21)] + [
    {"step": 10, "eval_accuracy": 48.44, "eval_loss": 0.69}, {"step": 20, "eval_accuracy": 51.56, "eval_loss": 0.688}]


def test_loss_figure_has_a_dev_panel_when_the_run_evaluated_and_plain_ticks():
    figure = summaries.loss_figure(RECORDS, "loss per example", "run")
    assert [ax.get_ylabel() for ax in figure.axes] == ["loss per example", "dev metric"]
    assert [line.get_label() for line in figure.axes[1].get_lines()] == ["eval_accuracy"]
    labels = plain_tick_labels(figure)
    assert labels and all(PLAIN_DECIMAL.match(text) for text in labels), labels


def test_loss_figure_without_evaluations_has_one_panel_and_a_wide_range_keeps_plain_log_ticks():
    figure = summaries.loss_figure([{"step": s, "loss": 8.0 / s} for s in range(1, 200)], "cross entropy", "run")
    (ax,) = figure.axes
    assert ax.get_yscale() == "log"
    labels = plain_tick_labels(figure)
    assert labels and all(PLAIN_DECIMAL.match(text) for text in labels), labels


@pytest.mark.parametrize("dev, shown", [
    ({"eval_entity_precision": 60.0, "eval_entity_recall": 70.0, "eval_entity_f1": 64.6, "eval_token_accuracy": 97.0},
     ("entity_f1", 64.6)),
    ({"eval_exact_match": 40.0, "eval_f1": 52.0, "eval_loss": 1.2}, ("f1", 52.0)),
    ({"eval_loss": 2.0, "eval_glue_sst2/accuracy": 80.0, "eval_glue_average": 75.0}, ("glue_average", 75.0)),
    ({"eval_loss": 2.0, "eval_spearman_corrcoef": 81.0}, ("spearman_corrcoef", 81.0)),
    ({"eval_loss": 2.0}, ("loss", 2.0)),
])
def test_the_bar_shows_the_tasks_headline_dev_metric(dev, shown):
    """Tagging's entity F1 rather than its precision, SQuAD's F1, a benchmark's average, else the
    first metric that is not a loss."""
    from t5lite.train.trainer import _headline_dev
    assert _headline_dev(dev) == shown


def test_an_evaluated_split_other_than_validation_is_named_by_its_own_name(tmp_path, capsys, caplog, monkeypatch):
    """`train.eval_split` bound to 'train' through a macro (a tagging recipe evaluates `test`): the
    evaluation line, the bar, the final line and loss.png's metric panel all name that split, never `dev`."""
    figures = []
    monkeypatch.setattr(summaries, "loss_figure", lambda *a, build=summaries.loss_figure: figures.append(build(*a))
                        or figures[-1])
    out, err, logged, records = train_sst2(tmp_path, capsys, caplog, "--gin.train.eval_split=%SPLIT",
                                           "--gin.SPLIT='train'")
    lines = [message for name, message in logged if name == "t5lite.events" and " examples)" in message]
    assert len(lines) == 1 and lines[0].startswith("step 2 train: accuracy="), lines
    printed = f"{next(r['eval_accuracy'] for r in records if 'eval_accuracy' in r):.4g}"
    assert f"train_accuracy={printed}" in err.rsplit("\r", 1)[-1] and "dev_" not in err
    assert f"| train accuracy={printed}" in final_line(out) and "| dev " not in final_line(out)
    (figure,) = figures
    assert [ax.get_ylabel() for ax in figure.axes] == ["loss per example", "train metric"]
