"""The command line: gin flags as T5X takes them, clear failures, and `tasks list/show`."""
import subprocess
import sys

import gin
import pytest

from t5lite import cli
from t5lite.errors import ConfigError

QUICKSTART = "configs/local/t5_tiny_pretrain.gin"


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_gin_flags_are_split_from_other_arguments():
    files, bindings, rest = cli.split_gin_flags(
        ["train", "--gin_file=a.gin", "--gin_file", "b.gin,c.gin", "--gin.MODEL_DIR='/x'", "--gin.train.seed=3"])
    assert files == ["a.gin", "b.gin", "c.gin"]
    assert bindings == ["MODEL_DIR = '/x'", "train.seed = 3"]
    assert rest == ["train"]


def test_quickstart_config_parses_with_all_macros():
    cli.parse_gin([QUICKSTART], ["MODEL_DIR = '/tmp/x'", "TRAIN_STEPS = 5"])
    assert gin.query_parameter("%TRAIN_STEPS") == 5
    assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "embedded_docs_span_corruption"


def test_misspelled_binding_fails_naming_it():
    with pytest.raises(ConfigError, match="train_stepz"):
        cli.parse_gin([QUICKSTART], ["MODEL_DIR = '/tmp/x'", "train.train_stepz = 5"])


def test_missing_required_macro_fails_naming_it():
    with pytest.raises(ConfigError, match="MODEL_DIR"):
        cli.parse_gin([QUICKSTART], [])


def test_every_shipped_config_parses():
    from pathlib import Path
    for path in sorted(Path(cli.REPO_ROOT, "configs").rglob("*.gin")):
        gin.clear_config()
        cli.parse_gin([str(path)], ["MODEL_DIR = '/tmp/x'"])


def _t5lite(*args):
    return subprocess.run([sys.executable, "-m", "t5lite.cli", *args], capture_output=True, text=True, timeout=300)


def test_tasks_list_and_show():
    listed = _t5lite("tasks", "list")
    assert listed.returncode == 0 and "embedded_docs_span_corruption" in listed.stdout.split()
    shown = _t5lite("tasks", "show", "embedded_docs_span_corruption", "-n", "2",
                    "--sequence_length", "inputs=64,targets=16")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("--- example") == 2
    assert "inputs (decoded):" in shown.stdout and "<extra_id_0>" in shown.stdout and "targets ids (" in shown.stdout


def test_unknown_task_lists_close_names():
    shown = _t5lite("tasks", "show", "embedded_docs_span_corruptoin")
    assert shown.returncode != 0 and "Did you mean: embedded_docs_span_corruption" in shown.stderr
