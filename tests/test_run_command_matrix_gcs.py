"""The run-command matrix of test_run_command_matrix.py on gs:// runs (a bucket on the GCS emulator
of test_gcs.py): each command given `gs://bucket/run` works or is refused in one line that says what
the run is (never "does not exist"), and nothing lands in a local `gs:` folder. The fast test walks
a T5 and a LoRA run on it, both trained into the bucket; the slow one every run kind, copied there."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, TINY_LENGTHS, TINY_TASK, train_tiny
from test_gcs import BUCKET, gcs  # noqa: F401  (the emulator fixture)
from test_run_command_matrix import (assert_works_or_is_refused, clean_gin, every_kind_with_every_command,  # noqa: F401
                                     kinds, run_cli, runs)


def assert_works_or_is_refused_in_the_bucket(kind, command, run, recipe, out, capsys) -> int:
    """`assert_works_or_is_refused` for a gs:// run, leaving no local `gs:` folder
    (os.path.abspath('gs://b/run') is '<cwd>/gs:/b/run')."""
    code = assert_works_or_is_refused(kind, command, run, recipe, out, capsys)
    assert not (Path.cwd() / "gs:").exists() and not (out / "gs:").exists(), "a gs:// path was used as a local one"
    return code


@pytest.fixture(scope="module")
def micro_runs(gcs):  # noqa: F811
    """{kind: (run, its recipe)}: a micro T5 trained 1 step and a LoRA run on it, both in the bucket."""
    from t5lite.models import get_config, peft
    config = get_config("t5_tiny", d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=1,
                        num_decoder_layers=1, vocab_size=2176)
    base, lora = f"gs://{BUCKET}/micro/base", f"gs://{BUCKET}/micro/lora"
    train_tiny(base, config, 1)
    train_tiny(lora, config, 1, peft=peft.LoRA(), initial_checkpoint_path=base)
    recipe = [f"--gin.MIXTURE_OR_TASK_NAME='{TINY_TASK}'", f"--gin.TASK_FEATURE_LENGTHS={TINY_LENGTHS}"]
    return {"pretrained": (base, recipe), "peft": (lora, recipe)}


# The commands that read a run without decoding or training (the slow walk has the others), and
# the cells of these two runs that are refused: --merge and --to_elmo of a T5, --to_elmo of a LoRA run.
FAST_COMMANDS = ("embed", "attention", "neighbours", "to_hf", "merge", "to_elmo")
MICRO_REFUSED = {("pretrained", "merge"), ("pretrained", "to_elmo"), ("peft", "to_elmo")}


@pytest.mark.parametrize("command", FAST_COMMANDS)
@pytest.mark.parametrize("kind", ["pretrained", "peft"])
def test_a_gs_t5_and_lora_run_with_the_commands_that_read_them(micro_runs, kind, command, tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = assert_works_or_is_refused_in_the_bucket(kind, command, *micro_runs[kind], tmp_path, capsys)
    assert code == (2 if (kind, command) in MICRO_REFUSED else 0)


@pytest.fixture(scope="module")
def gs_kinds(kinds, gcs):  # noqa: F811
    """{kind: (the local matrix's run copied into the bucket, its recipe)}, each copied on first use."""
    _, fs = gcs
    copied = {}

    def copy(kind):
        if kind not in copied:
            run, recipe = kinds(kind)
            fs.put(run, f"{BUCKET}/kinds/{kind}", recursive=True)
            copied[kind] = (f"gs://{BUCKET}/kinds/{kind}", recipe)
        return copied[kind]
    return copy


@every_kind_with_every_command
def test_every_gs_run_kind_with_every_command(gs_kinds, kind, command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)   # the recipes include gin files by repository paths
    assert_works_or_is_refused_in_the_bucket(kind, command, *gs_kinds(kind), tmp_path, capsys)


@pytest.mark.parametrize("argv", [["convert", "--from_hf", "{hf}", "--out", "{tmp}/run"],
                                  ["attention", "--model", "{hf}", "--data_dir", "{tmp}", "--out", "{tmp}/run"]],
                         ids=["convert", "attention"])
def test_a_hugging_face_folder_in_a_bucket_is_refused_in_one_line(gcs, tmp_path, capsys, argv):  # noqa: F811
    """t5lite reads Hugging Face folders (and their tokenizer files) from local disk: the refusal says
    to copy it, where it used to say that the folder does not exist."""
    _, fs = gcs
    fs.pipe(f"{BUCKET}/hf/config.json", b'{"model_type": "bert"}')
    code, err = run_cli([a.format(hf=f"gs://{BUCKET}/hf", tmp=tmp_path) for a in argv], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"gs://{BUCKET}/hf is in a bucket" in err and "copy it first" in err, err
    assert not (tmp_path / "run").exists()
