"""Everyday mistakes, tried as a user makes them: each ends in exit code 2 and exactly one line on
stderr naming the input at fault (the traceback only with --debug), most before any JAX compile."""
from __future__ import annotations

import json
import sys

import gin
import pytest

from conftest import shared_data_dir
from t5lite import cli

QUICKSTART = "configs/local/t5_tiny_pretrain.gin"
SST2 = "configs/local/t5_tiny_finetune_sst2.gin"
ELECTRA = "configs/local/electra_tiny_pretrain.gin"


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _zero_run(run_dir, preset: str) -> str:
    """A checkpoint of `preset` (all parameters 0) for commands that only need one to load."""
    import jax
    import jax.numpy as jnp
    from t5lite.infer.predict import abstract_params
    from t5lite.models import get_config
    from t5lite.train.checkpoints import Checkpointer
    params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), abstract_params(get_config(preset)))
    ckpt = Checkpointer(str(run_dir / "checkpoints"), save_every=1, async_save=False)
    ckpt.save(0, {"params": params}, {}, force=True)
    ckpt.close()
    return str(run_dir)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The inputs the cases name: runs, a garbage vocabulary, an empty prompts file, a raw text file."""
    root = tmp_path_factory.mktemp("inputs")
    (root / "garbage.model").write_bytes(bytes(range(256)) * 8)
    (root / "empty.txt").write_text("\n \n")
    (root / "page.txt").write_text("A page of text that is long enough to keep, with five words or more.\n")
    (root / "empty_run").mkdir()
    (root / "typo.gin").write_text(f"include '{QUICKSTART}'\nTASK_FEATURE_LENGHTS = {{'inputs': 32, 'targets': 8}}\n")
    return {"root": str(root), "t5_run": _zero_run(root / "t5_run", "t5_tiny"),
            "bert_run": _zero_run(root / "bert_run", "bert_tiny")}


def _no_tfds(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)   # as where it is not installed


# (id, argv with {placeholders} from `files`, what the one line must name, setup or None)
CASES = [
    ("infer_missing_checkpoint", ["infer", "--gin.CHECKPOINT_PATH='{root}/no_such_run'", "a prompt"],
     "{root}/no_such_run' does not exist", None),
    ("eval_run_without_checkpoint", ["eval", f"--gin_file={SST2}", "--gin.MODEL_DIR='{root}/empty_run'",
                                     f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'"],
     "{root}/empty_run", None),
    ("eval_bert_run_with_t5_config", ["eval", f"--gin_file={SST2}", "--gin.CHECKPOINT_PATH='{bert_run}'",
                                      f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'"],
     "{bert_run}/checkpoints/0 has no parameter ['decoder']", None),
    ("garbage_vocabulary", ["infer", f"--gin_file={SST2}", "--gin.CHECKPOINT_PATH='{t5_run}'",
                            "--gin.vocabulary.path='{root}/garbage.model'", "a prompt"],
     "vocabulary '{root}/garbage.model' is not a readable sentencepiece", None),
    ("electra_generator_of_other_width", ["train", f"--gin_file={ELECTRA}", "--gin.MODEL_DIR='{root}/electra'",
                                          "--gin.ElectraObjective.generator='bert_tiny'"],
     "ElectraObjective.generator_overrides", None),
    ("electra_generator_override_typo", ["train", f"--gin_file={ELECTRA}", "--gin.MODEL_DIR='{root}/electra'",
                                         "--gin.ElectraObjective.generator_overrides={{'embeding_size': 32}}"],
     "ElectraObjective.generator='electra_tiny_generator': model config has no field 'embeding_size'; did you "
     "mean embedding_size", None),
    ("unknown_preset", ["train", f"--gin_file={QUICKSTART}", "--gin.MODEL_DIR='{root}/run'",
                        "--gin.model_config.preset='t5_tinyy'"], "unknown model preset 't5_tinyy'", None),
    ("string_for_a_number", ["train", f"--gin_file={QUICKSTART}", "--gin.MODEL_DIR='{root}/run'",
                             "--gin.TRAIN_STEPS=1", "--gin.warmup_cosine.warmup_steps='abc'"],
     "--gin.warmup_cosine.warmup_steps is 'abc' (str), but warmup_cosine.warmup_steps takes int", None),
    ("misspelled_macro_on_the_command_line", ["train", f"--gin_file={QUICKSTART}", "--gin.MODEL_DIR='{root}/run'",
                                              "--gin.TRAIN_STEPS=1", "--gin.BATCH_SIZ=4"],
     "--gin.BATCH_SIZ is set but nothing in the config uses it; did you mean BATCH_SIZE?", None),
    ("misspelled_macro_in_a_file", ["train", "--gin_file={root}/typo.gin", "--gin.MODEL_DIR='{root}/run'",
                                    "--gin.TRAIN_STEPS=1"],
     "gin macro TASK_FEATURE_LENGHTS (set in {root}/typo.gin) is set but nothing in the config uses it; did you "
     "mean TASK_FEATURE_LENGTHS?", None),
    ("infer_batch_of_zero", ["infer", f"--gin_file={SST2}", "--gin.CHECKPOINT_PATH='{t5_run}'",
                             "--gin.infer.batch_size=0", "a prompt"], "infer.batch_size=0: give a whole number", None),
    ("negative_train_steps", ["train", f"--gin_file={QUICKSTART}", "--gin.MODEL_DIR='{root}/run'",
                              "--gin.TRAIN_STEPS=-1"], "TRAIN_STEPS=-1: give a whole number", None),
    ("zero_feature_length", ["train", f"--gin_file={QUICKSTART}", "--gin.MODEL_DIR='{root}/run'",
                             "--gin.TASK_FEATURE_LENGTHS={{'inputs': 0, 'targets': 8}}"],
     "TASK_FEATURE_LENGTHS['inputs']=0: give a whole number", None),
    ("tasks_show_negative_count", ["tasks", "show", "embedded_docs_span_corruption", "-n", "-1"],
     "argument -n/--num_examples: give a whole number >= 1, not -1", None),
    ("tasks_show_without_tfds", ["tasks", "show", "glue_sst2"], "pip install tensorflow-datasets", _no_tfds),
    ("infer_empty_prompts_file", ["infer", "--gin.CHECKPOINT_PATH='{t5_run}'", "--input_file", "{root}/empty.txt"],
     "--input_file {root}/empty.txt is empty", None),
    ("prepare_split_escaping_output", ["prepare", "--input", "{root}/page.txt", "--output", "{root}/prepared",
                                       "--split", "../../x", "--no_language_filter"],
     "--split '../../x' is not a plain name", None),
]


@pytest.mark.parametrize("argv, names, setup", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_user_error_is_one_line_naming_the_input_with_exit_code_2(files, capsys, monkeypatch, argv, names, setup):
    monkeypatch.delenv("T5LITE_DEBUG", raising=False)
    if setup:
        setup(monkeypatch)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli.main([arg.format(**files) for arg in argv])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("t5lite: error: ") and names.format(**files) in err, err


def test_blank_prompt_lines_are_skipped_with_a_warning_naming_them(tmp_path, caplog):
    (tmp_path / "p.txt").write_text("one\n\n  \ntwo\n")
    with caplog.at_level("WARNING"):
        assert cli.read_inputs(str(tmp_path / "p.txt")) == ["one", "two"]
    assert [r.getMessage() for r in caplog.records] == [
        f"--input_file {tmp_path / 'p.txt'}: skipped 2 blank line(s) (line 2, 3); each non-blank line is one input"]
    caplog.clear()
    (tmp_path / "q.jsonl").write_text(json.dumps({"input": "x"}) + "\n")   # a final newline is no blank line
    with caplog.at_level("WARNING"):
        assert cli.read_inputs(str(tmp_path / "q.jsonl")) == ["x"]
    assert not caplog.records


def test_an_unprepared_tfds_dataset_is_one_line_on_stderr(tmp_path):
    """TFDS logs a warning about each folder it looked in before failing; the error says it all."""
    import subprocess
    pytest.importorskip("tensorflow_datasets", reason="the TFDS branch needs tensorflow-datasets")
    (tmp_path / "glue" / "sst2" / "2.0.0").mkdir(parents=True)   # a variant folder TFDS warns about
    run = subprocess.run([sys.executable, "-m", "t5lite.cli", "tasks", "show", "glue_sst2", "--data_dir",
                          str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr
    assert run.stderr.startswith(f"t5lite: error: split 'train' not found in data_dir {tmp_path}")


def test_a_refused_first_start_leaves_no_empty_run_folder_and_keeps_an_existing_one(tmp_path, capsys):
    """A train refused after its folders were checked (a GLUE folder whose train.tsv has no row)
    removes the MODEL_DIR it made, parents too; a folder the user made stays."""
    glue = tmp_path / "glue" / "SST-2"
    glue.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (glue / name).write_text("sentence\tlabel\n")
    existing = tmp_path / "mine"
    existing.mkdir()
    for model_dir in (tmp_path / "new" / "run", existing / "run"):
        with pytest.raises(SystemExit) as exited:
            cli.main(["train", f"--gin_file={SST2}", f"--gin.MODEL_DIR='{model_dir}'",
                      "--gin.INITIAL_CHECKPOINT_PATH=None", f"--gin.DATA_DIR='{tmp_path / 'glue'}'"])
        assert exited.value.code == 2 and "has no examples" in capsys.readouterr().err
        assert sorted(p.name for p in tmp_path.iterdir() if p.name != "glue") == ["mine"]
        gin.clear_config()
    assert list(existing.iterdir()) == []
