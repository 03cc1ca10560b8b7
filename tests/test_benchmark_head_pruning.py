"""`benchmarks/head_pruning_curve.py` on a tiny classifier (bert_tiny, 2 layers x 4 heads, fine-tuned
2 steps on SST-2): its curve starts at the accuracy `t5lite eval` reports for the unpruned run, and
prunes by Michel et al.'s ranking (re-derived here in numpy) and by nested random orders."""
import json

import numpy as np
import pytest

from conftest import REPO, load_benchmark, shared_data_dir

GIN = str(REPO / "configs/local/bert_tiny_finetune_sst2.gin")


def _benchmark():
    return load_benchmark("head_pruning_curve")


def _eval_accuracy(run, out, examples):
    """`t5lite eval` of the unpruned run, as a user runs it."""
    import gin

    from t5lite import cli
    gin.clear_config()
    cli.main(["eval", f"--gin_file={GIN}", f"--gin.CHECKPOINT_PATH='{run}'", f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'",
              f"--gin.eval.max_examples={examples}", f"--gin.eval.output_dir='{out}'"])
    gin.clear_config()
    return json.loads((out / "bert_glue_sst2.validation" / "metrics.jsonl").read_text().splitlines()[-1])["accuracy"]


def _michel_heads(importance, count):
    """The `count` heads to prune, in numpy: scores over their layer's l2 norm (Michel et al.'s code,
    --normalize_pruning_by_layer), then the lowest over all layers."""
    names = sorted(importance)
    scores = np.concatenate([np.asarray(importance[n]) / np.linalg.norm(importance[n]) for n in names])
    owner = [(n, h) for n in names for h in range(len(importance[n]))]
    return sorted(owner[i] for i in np.argsort(scores, kind="stable")[:count])


def _pairs(pruned):
    return sorted((p, h) for p, heads in pruned.items() for h in heads)


def test_head_pruning_curve_starts_at_the_eval_accuracy_and_prunes_by_michel_et_als_ranking(
        bert_tiny_sst2_run, tmp_path, capsys):
    out = tmp_path / "curve"
    _benchmark().main(["--glue_dir", str(shared_data_dir() / "glue"), "--out", str(out), "--run", bert_tiny_sst2_run,
                       "--gin_file", GIN, "--batches", "2", "--seeds", "2", "--eval_examples", "48"])
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "%" in line]
    result = json.loads((out / "head_pruning_curve.json").read_text())
    assert (out / "head_pruning_curve.png").stat().st_size > 0
    rows = result["rows"]
    assert result["heads"] == 8 and len(table) == len(rows) == 10
    assert [r["share"] for r in rows] == list(range(0, 100, 10))
    assert [r["heads"] for r in rows] == [0, 0, 1, 2, 3, 4, 4, 5, 6, 7]

    unpruned = _eval_accuracy(bert_tiny_sst2_run, tmp_path / "eval", 48)
    for accuracy in (rows[0]["token"], rows[0]["batch"], *rows[0]["random"]):
        assert accuracy == pytest.approx(unpruned, rel=1e-6)
    for row in rows:
        assert all(0 <= a <= 100 for a in (row["token"], row["batch"], *row["random"]))
        assert row["random_mean"] == pytest.approx(np.mean(row["random"]), rel=1e-9)
        assert row["random_std"] == pytest.approx(np.std(row["random"], ddof=1), rel=1e-9, abs=1e-12)
        for granularity in ("token", "batch"):
            assert _pairs(row["pruned"][granularity]) == _michel_heads(result["importance"][granularity], row["heads"])
    # per example and token, |.| before the sum: never below the per-batch |sum|
    for path, scores in result["importance"]["token"].items():
        assert np.all(np.asarray(scores) >= np.asarray(result["importance"]["batch"][path]) * (1 - 1e-6))


@pytest.mark.parametrize("flag", ["--seeds", "--batches", "--steps"])
def test_a_count_below_one_is_refused_in_one_line_and_writes_nothing(flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        _benchmark().main(["--glue_dir", str(tmp_path), "--out", str(tmp_path / "out"), flag, "0"])
    assert exit_.value.code == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1 and flag in message and "0 is not >= 1" in message
    assert not (tmp_path / "out").exists()
