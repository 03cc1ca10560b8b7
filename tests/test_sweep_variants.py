"""Sweep cells without pre-training (the from-scratch row) and task variants (a task fine-tuned with
extra bindings, e.g. fewer labels), through tests/sweep_fake_cli.py: what each run is told, and how
the report reads them."""
import csv
import json

import pytest

from conftest import REPO, shared_data_dir
from test_sweep import sweep, write_sweep

from t5lite.errors import ConfigError

SCRATCH = """
sweep.cells = {
    'good_enc_dec': {'pretrain': ['configs/local/t5_tiny_pretrain.gin'], 'tokens_per_row': 160,
                     'finetune': ['configs/local/t5_tiny_finetune_sst2.gin']},
    'scratch': {'pretrain': [], 'finetune': ['configs/local/t5_tiny_finetune_sst2.gin']},
}
sweep.tasks = {'sst2': 'accuracy', 'sst2_few': 'accuracy'}
sweep.task_variants = {'sst2_few': ('sst2', ['train.train_examples = 16'])}
sweep.claims = [('pre-training helps with few labels', 'good_enc_dec', 'scratch', 'sst2_few')]
"""


def scratch_sweep(tmp_path, extra=""):
    gin_file = write_sweep(tmp_path)
    gin_file.write_text(gin_file.read_text() + SCRATCH + extra)
    return gin_file


def test_stages_of_a_scratch_cell_and_of_a_task_variant(tmp_path, clean_gin_state):
    from t5lite.experiments import spec
    from t5lite.experiments.runner import stages
    sweep_ = spec.load([str(scratch_sweep(tmp_path))], [], [str(REPO)])
    pretrained, scratch = sweep_.cells
    assert sweep_.pretrain_steps(scratch) == 0 and sweep_.pretrain_steps(pretrained) == 2560 // (4 * 160)
    runs = {stage: bindings for stage, _, bindings in stages(sweep_, scratch, 0, tmp_path)}
    assert list(runs) == ["finetune_sst2", "finetune_sst2_few"]   # no pre-training stage
    assert all("INITIAL_CHECKPOINT_PATH = None" in b for b in runs.values())
    assert "MIXTURE_OR_TASK_NAME = 'glue_sst2'" in runs["finetune_sst2_few"]   # the variant's own task
    assert "train.train_examples = 16" in runs["finetune_sst2_few"] and "train.train_examples = 16" not in runs["finetune_sst2"]
    runs = {stage: bindings for stage, _, bindings in stages(sweep_, pretrained, 0, tmp_path)}
    assert f"INITIAL_CHECKPOINT_PATH = '{tmp_path / 'pretrain'}'" in runs["finetune_sst2_few"]


def test_a_sweep_with_a_scratch_row_and_a_variant_reports_both_on_the_tasks_dev_set(tmp_path):
    gin_file = scratch_sweep(tmp_path, f"\nsweep.data_dir = '{shared_data_dir() / 'glue'}'\n")
    out = tmp_path / "out"
    result = sweep(gin_file, out)
    assert result.returncode == 0, result.stderr
    assert not (out / "scratch__seed0" / "pretrain").exists() and (out / "scratch__seed0" / "finetune_sst2_few").is_dir()
    report = json.loads((out / "report.json").read_text())
    with open(shared_data_dir() / "glue" / "SST-2" / "dev.tsv", newline="") as f:   # the ci scale scores 16
        labels = [row["label"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:16]
    majority = 100 * max(labels.count(label) for label in set(labels)) / 16
    assert report["baselines"]["sst2_few"] == report["baselines"]["sst2"] == pytest.approx(majority)
    scratch = report["cells"]["scratch"]
    assert len(scratch["seeds"]) == 2 and scratch["cost_per_seed"]["pretrain_steps"] == 0
    assert "flops" not in scratch["cost_per_seed"]   # nothing pre-trained
    assert report["claims"][0]["tasks"].keys() == {"sst2_few"}
    assert "| scratch |" in (out / "report.md").read_text()


@pytest.mark.parametrize("variants, message", [
    ("{'sst2_fewer': ('sst2', [])}", r"task variant 'sst2_fewer' is not a column of sweep.tasks"),
    ("{'sst2_few': 'sst2'}", r"task variant 'sst2_few': give \(task, \[bindings\]\)"),
])
def test_a_bad_variant_is_one_line(tmp_path, clean_gin_state, variants, message):
    from t5lite.experiments import spec
    gin_file = scratch_sweep(tmp_path, f"\nsweep.task_variants = {variants}\n")
    with pytest.raises(ConfigError, match=message):
        spec.load([str(gin_file)], [], [str(REPO)])


def test_a_scales_task_list_keeps_the_variants_of_its_tasks(tmp_path, clean_gin_state):
    from t5lite.experiments import spec
    gin_file = scratch_sweep(tmp_path)   # the ci scale runs sst2 and rte
    assert list(spec.load([str(gin_file)], [], [str(REPO)]).tasks) == ["sst2", "sst2_few"]
    gin_file.write_text(gin_file.read_text().replace("sweep.tasks = {'sst2': 'accuracy', 'sst2_few': 'accuracy'}",
                                                     "sweep.tasks = {'cola': 'matthews_corrcoef'}")
                        .replace("sweep.task_variants = {'sst2_few': ('sst2', ['train.train_examples = 16'])}", "")
                        .replace("'sst2_few')]", "'cola')]"))
    with pytest.raises(ConfigError, match=r"scale 'ci': its tasks \['rte', 'sst2'\] leave none of sweep.tasks \['cola'\]"):
        spec.load([str(gin_file)], [], [str(REPO)])
