"""The command line: gin flags as T5X takes them, clear failures, and `tasks list/show`."""
import contextlib
import logging
import json
import re
import signal
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


@pytest.mark.parametrize("config", ["t5_tiny_finetune_sst2", "bert_tiny_finetune_sst2", "minilm_finetune_sst2",
                                    "bert_tiny_finetune_squad", "t5_tiny_pretrain_prepared"])
def test_configs_that_read_data_name_data_dir_until_it_is_given(config):
    """Data lives outside the repository, so no config guesses where: a missing DATA_DIR is named."""
    from t5lite.train.trainer import train
    path = cli.REPO_ROOT / "configs" / "local" / f"{config}.gin"
    bindings = ["MODEL_DIR = '/tmp/x'"] + [binding for name, binding in (
        ("INITIAL_CHECKPOINT_PATH", "INITIAL_CHECKPOINT_PATH = None"), ("VOCABULARY", "VOCABULARY = 'vocab.txt'"))
        if _uses_macro(path, name)]
    with pytest.raises(ConfigError, match="DATA_DIR"):
        cli.parse_gin([str(path)], bindings, entry=("train", train))
    gin.clear_config()
    cli.parse_gin([str(path)], bindings + ["DATA_DIR = 'data/x'"], entry=("train", train))
    assert gin.query_parameter("train.data_dir").scoped_selector.startswith("DATA_DIR")


def test_fewshot_config_needs_data_dir_for_eval_only():
    from t5lite.infer.evaluation import evaluate
    from t5lite.train.trainer import train
    config = "configs/local/gpt2_tiny_fewshot_eval.gin"
    cli.parse_gin([config], ["MODEL_DIR = '/tmp/x'"], entry=("train", train))
    gin.clear_config()
    with pytest.raises(ConfigError, match="DATA_DIR"):
        cli.parse_gin([config], ["CHECKPOINT_PATH = '/tmp/x'"], required_macros=(), entry=("eval", evaluate),
                      base_file="gin/eval.gin")


def test_misspelled_binding_fails_naming_it():
    with pytest.raises(ConfigError, match="train_stepz"):
        cli.parse_gin([QUICKSTART], ["MODEL_DIR = '/tmp/x'", "train.train_stepz = 5"])


@pytest.mark.parametrize("binding, hint", [
    ("t5lite.train.electra.ElectraObjective.disc_weight = 2.0", "Write it as ElectraObjective: gin's short name"),
    ("ElectraObjectiv.disc_weight = 2.0", "Did you mean ElectraObjective"),
    ("trainn.seed = 3", "Did you mean train?")])
def test_an_unknown_configurable_names_the_one_meant(binding, hint):
    with pytest.raises(ConfigError, match=re.escape(hint)):
        cli.parse_gin([QUICKSTART], ["MODEL_DIR = '/tmp/x'", binding])


def test_a_gin_file_with_a_module_path_gin_does_not_know_names_the_short_name(tmp_path):
    (tmp_path / "old.gin").write_text(f"include '{QUICKSTART}'\nt5lite.train.word2vec.Word2VecObjective.window = 3\n")
    with pytest.raises(ConfigError, match=r"line 2 .*Write it as Word2VecObjective: gin's short name needs no"):
        cli.parse_gin([str(tmp_path / "old.gin")], ["MODEL_DIR = '/tmp/x'"])


def test_missing_required_macro_fails_naming_it():
    with pytest.raises(ConfigError, match="MODEL_DIR"):
        cli.parse_gin([QUICKSTART], [])


def _uses_macro(path, name: str) -> bool:
    """Whether gin file `path` or a file it includes refers to macro `name` (`%NAME`)."""
    import re
    text = path.read_text()
    includes = re.findall(r"^include '([^']+)'", text, re.M)
    return f"%{name}" in text or any(_uses_macro(cli.REPO_ROOT / name_, name) for name_ in includes)


def _shipped_configs():
    """(config, the bindings it needs to parse: MODEL_DIR and the optional macros it uses)."""
    from pathlib import Path
    for path in sorted(Path(cli.REPO_ROOT, "configs").rglob("*.gin")):
        if "sweeps" in path.parts:   # `t5lite sweep`'s specs, not train configs (tests/test_sweep.py parses them)
            continue
        optional = [f"{name} = {value}" for name, value in (("INITIAL_CHECKPOINT_PATH", None), ("VOCABULARY", None),
                                                             ("DATA_DIR", "'data'")) if _uses_macro(path, name)]
        yield path, ["MODEL_DIR = '/tmp/x'", *optional]


def test_every_shipped_config_parses():
    for path, bindings in _shipped_configs():
        gin.clear_config()
        cli.parse_gin([str(path)], bindings)


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


def test_tasks_show_truncates_long_id_lists_unless_asked():
    """A 512-id example shows its first 10 and last 5 ids and how many lie between; --all_ids shows all."""
    args = ("tasks", "show", "embedded_docs_span_corruption", "-n", "1", "--sequence_length", "inputs=64,targets=16")
    short, full = _t5lite(*args), _t5lite(*args, "--all_ids")
    assert short.returncode == 0 and full.returncode == 0, (short.stderr, full.stderr)
    shown = next(line for line in short.stdout.splitlines() if line.startswith("inputs ids (64): "))
    every = json.loads(next(line for line in full.stdout.splitlines() if line.startswith("inputs ids (64): ")).split(": ", 1)[1])
    assert len(every) == 64
    head, tail = ", ".join(map(str, every[:10])), ", ".join(map(str, every[-5:]))
    assert shown == f"inputs ids (64): [{head}, ... 49 more ..., {tail}] (--all_ids prints every id)"


def test_unknown_task_lists_close_names():
    shown = _t5lite("tasks", "show", "embedded_docs_span_corruptoin")
    assert shown.returncode == 2 and "Traceback" not in shown.stderr
    assert shown.stderr.strip().splitlines()[-1].startswith("t5lite: error: unknown task")
    assert "Did you mean: embedded_docs_span_corruption" in shown.stderr


def _main(capsys, *argv):
    """Runs `t5lite ARGV` in this process: (exit code, stderr)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(list(argv))
    return exited.value.code, capsys.readouterr().err


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("t5lite: error:")]


def test_t5lite_errors_are_one_line_with_exit_code_2_and_a_traceback_only_on_request(capsys, monkeypatch):
    args = ["train", f"--gin_file={QUICKSTART}", "--gin.MODEL_DIR='/tmp/x'", "--gin.TRAIN_STEPS=5",
            "--gin.train.train_stepz=5"]
    monkeypatch.delenv("T5LITE_DEBUG", raising=False)
    code, err = _main(capsys, *args)
    assert code == 2 and "Traceback" not in err
    assert _error_lines(err) == ["t5lite: error: --gin.train.train_stepz=5: Configurable 'train' doesn't have a "
                                 "parameter named 'train_stepz'."]
    gin.clear_config()
    code, err = _main(capsys, *args, "--debug")
    assert code == 2 and "Traceback" in err and "ConfigError" in err
    gin.clear_config()
    monkeypatch.setenv("T5LITE_DEBUG", "1")
    code, err = _main(capsys, *args)
    assert code == 2 and "Traceback" in err


def test_unexpected_errors_keep_their_traceback(monkeypatch):
    def broken(*args):
        raise RuntimeError("a bug")
    monkeypatch.setattr("t5lite.cli.tasks.cmd_tasks", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["tasks", "list"])


def test_unparsable_binding_names_it_and_shows_the_quoting_rule(capsys):
    code, err = _main(capsys, "train", f"--gin_file={QUICKSTART}", "--gin.MODEL_DIR=/tmp/x")
    assert code == 2
    assert _error_lines(err) == ["t5lite: error: --gin.MODEL_DIR=/tmp/x: gin cannot parse the value '/tmp/x'; values "
                                 "are Python literals, so a string needs inner quotes: --gin.MODEL_DIR=\"'/tmp/x'\""]


@pytest.mark.parametrize("binding, expected", [
    ("--gin.TRAIN_STEPS='5'", "--gin.TRAIN_STEPS is '5' (str), but train.train_steps takes int: "
                              "e.g. --gin.TRAIN_STEPS=100"),
    ("--gin.train.batch_size=8.0", "--gin.train.batch_size is 8.0 (float), but train.batch_size takes int"),
    ("--gin.TASK_FEATURE_LENGTHS={'inputs': '128'}",
     "train.task_feature_lengths takes Mapping[str, int]: "
     "e.g. --gin.TASK_FEATURE_LENGTHS=\"{'inputs': 128, 'targets': 32}\""),
    ("--gin.MODEL_DIR=3", "--gin.MODEL_DIR is 3 (int), but train.model_dir takes str"),
    ("--gin.train.data_dir=1", "train.data_dir takes str or None"),
])
def test_a_value_of_the_wrong_type_fails_at_parse_time(capsys, binding, expected):
    code, err = _main(capsys, "train", f"--gin_file={QUICKSTART}", "--gin.MODEL_DIR='/tmp/x'", binding)
    assert code == 2 and len(_error_lines(err)) == 1 and expected in err


def test_every_shipped_config_has_values_of_the_right_types():
    from t5lite.train.trainer import train
    for path, bindings in _shipped_configs():
        gin.clear_config()
        cli.parse_gin([str(path)], bindings, entry=("train", train))


def test_unknown_task_in_a_run_fails_before_any_work(capsys, tmp_path):
    code, err = _main(capsys, "train", f"--gin_file={QUICKSTART}", f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
                      "--gin.MIXTURE_OR_TASK_NAME='glue_sst'")
    assert code == 2 and len(_error_lines(err)) == 1 and "Did you mean: glue_sst2" in err
    assert not (tmp_path / "run").exists()


def test_a_prompts_file_that_is_not_utf8_is_named_with_line_and_byte(capsys, tmp_path):
    data = "first prompt\nsecond: caf".encode() + "é".encode("latin-1") + b"\nthird\n"
    (tmp_path / "prompts.txt").write_bytes(data)
    code, err = _main(capsys, "infer", f"--gin_file={QUICKSTART}", "--input_file", str(tmp_path / "prompts.txt"))
    assert code == 2 and len(_error_lines(err)) == 1
    assert f"--input_file {tmp_path / 'prompts.txt'}: line 2 is not UTF-8 (byte {data.index(0xE9)} of the file" in err
    assert "iconv" in err


def test_infer_reads_utf8_prompts_skipping_blank_lines(tmp_path):
    (tmp_path / "p.txt").write_bytes("\ufeffone\r\n\n  \ntwo é\n".encode())
    assert cli.read_inputs(str(tmp_path / "p.txt")) == ["one", "two é"]


def test_unwritable_infer_output_fails_before_decoding(capsys, tmp_path):
    (tmp_path / "a_file").write_text("x")
    code, err = _main(capsys, "infer", f"--gin_file={QUICKSTART}", "--output", str(tmp_path / "a_file" / "out.jsonl"),
                      "some text")
    assert code == 2 and f"cannot write to {tmp_path / 'a_file'} (set by --output)" in err


def _zero_t5_tiny_run(run_dir) -> None:
    """A t5_tiny checkpoint (all parameters 0) for commands that only need one to load."""
    import jax
    import jax.numpy as jnp
    from t5lite.infer.predict import abstract_params
    from t5lite.models import get_config
    from t5lite.train.checkpoints import Checkpointer
    params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), abstract_params(get_config("t5_tiny")))
    ckpt = Checkpointer(str(run_dir / "checkpoints"), save_every=1, async_save=False)
    ckpt.save(0, {"params": params}, {}, force=True)
    ckpt.close()


def test_infer_writes_output_file_and_warns_about_truncated_inputs(tmp_path, caplog):
    import json
    _zero_t5_tiny_run(tmp_path / "run")
    out = tmp_path / "new" / "predictions.jsonl"
    with caplog.at_level(logging.WARNING):
        cli.main(["infer", "--gin_file=configs/local/t5_tiny_finetune_sst2.gin",
                  f"--gin.CHECKPOINT_PATH='{tmp_path / 'run'}'", "--gin.infer.max_input_length=8",
                  "--gin.infer.max_decode_length=2", "--gin.infer.batch_size=1", "--output", str(out),
                  "short", "a much longer input than eight tokens, surely", "another input longer than eight tokens"])
    assert [json.loads(line)["input"] for line in out.read_text().splitlines()] == [
        "short", "a much longer input than eight tokens, surely", "another input longer than eight tokens"]
    warnings = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
    assert warnings == ["2 of 3 inputs are longer than infer.max_input_length=8 tokens (with EOS): truncated to their "
                        "first 8 tokens (input 1, 2); raise infer.max_input_length to decode more of them"]


def test_unwritable_eval_output_dir_fails_before_evaluating(capsys, tmp_path):
    _zero_t5_tiny_run(tmp_path / "run")
    (tmp_path / "a_file").write_text("x")
    code, err = _main(capsys, "eval", "--gin_file=configs/local/t5_tiny_finetune_sst2.gin",
                      f"--gin.CHECKPOINT_PATH='{tmp_path / 'run'}'", f"--gin.DATA_DIR='{tmp_path / 'no_data'}'",
                      f"--gin.eval.output_dir='{tmp_path / 'a_file' / 'eval'}'")
    assert code == 2 and f"cannot write to {tmp_path / 'a_file' / 'eval'} (set by eval.output_dir)" in err


@contextlib.contextmanager
def _fails_after(seconds: int):
    """Turns a hang into a test failure (SIGALRM interrupts the blocked main thread)."""
    def timeout(*_):
        raise TimeoutError(f"no result within {seconds}s")
    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("train_tsv, bindings", [
    ("", []),
    ("sentence\tlabel\nno label column\nbad label\tx\n", ["--gin.malformed_rows.policy='skip'"]),
])
def test_a_train_split_without_examples_stops_the_run_naming_the_file(capsys, caplog, tmp_path, train_tsv, bindings):
    """An epoch without examples stops the run with exit code 2 in seconds, instead of spinning the
    loader over empty epochs."""
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    (tmp_path / "glue" / "SST-2" / "train.tsv").write_text(train_tsv)
    with _fails_after(120):
        code, err = _main(capsys, "train", "--gin_file=configs/local/t5_tiny_finetune_sst2.gin",
                          f"--gin.MODEL_DIR='{tmp_path / 'run'}'", f"--gin.DATA_DIR='{tmp_path / 'glue'}'",
                          "--gin.INITIAL_CHECKPOINT_PATH=None", "--gin.EVAL_EVERY=0", "--gin.TRAIN_STEPS=2",
                          *bindings)
    path = tmp_path / "glue" / "SST-2" / "train.tsv"
    assert code == 2 and _error_lines(err)[0].startswith(f"t5lite: error: split 'train' has no examples: {path}")
    if bindings:  # the skip policy came from the gin binding: rows were skipped, not a failure at the first
        assert "skipped 2 malformed row(s)" in caplog.text


def test_gin_include_search_logs_no_errors_from_another_folder(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO):
        cli.parse_gin([str(cli.REPO_ROOT / QUICKSTART)], ["MODEL_DIR = '/tmp/x'"])
    assert not [r for r in caplog.records if "Path not found" in r.getMessage()]


def test_a_repository_config_is_found_from_another_folder(tmp_path, monkeypatch):
    """With the repository on the Python path (PYTHONPATH, an editable install), gin took
    `configs/local` for a Python package and failed with a TypeError."""
    monkeypatch.syspath_prepend(str(cli.REPO_ROOT))
    monkeypatch.chdir(tmp_path)
    cli.parse_gin([QUICKSTART], ["MODEL_DIR = '/tmp/x'"])
    assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "embedded_docs_span_corruption"


def test_gin_file_errors_keep_the_file_and_line(tmp_path):
    (tmp_path / "bad.gin").write_text("include 'gin/train.gin'\n\ntrainn.seed = 3\n")
    with pytest.raises(ConfigError, match=r"gin file error: No configurable matching 'trainn'\. In file .*bad\.gin"):
        cli.parse_gin([str(tmp_path / "bad.gin")], [])


def test_sequence_lengths_parse_or_say_how_to_write_them():
    assert cli.parse_lengths("inputs=64, targets=16") == {"inputs": 64, "targets": 16}
    for bad in ("inputs=64,targets", "inputs:64", "inputs=sixty"):
        with pytest.raises(ConfigError, match="FEATURE=LENGTH pairs"):
            cli.parse_lengths(bad)


@pytest.mark.parametrize("content, expected", [
    ('{"input": "a"}\n{"input": "b",}\n', "line 2 is not valid JSON"),
    ('{"input": "a"}\n\n["b"]\n', "line 3 has no string field 'input' (found list)"),
    ('{"text": "a"}\n', "line 1 has no string field 'input' (found ['text']); name the input field with --field")])
def test_malformed_json_lines_are_named(capsys, tmp_path, content, expected):
    (tmp_path / "prompts.jsonl").write_text(content)
    code, err = _main(capsys, "infer", "--input_file", str(tmp_path / "prompts.jsonl"))
    assert code == 2 and len(_error_lines(err)) == 1
    assert f"--input_file {tmp_path / 'prompts.jsonl'}: {expected}" in err


def test_json_lines_give_their_field(tmp_path):
    (tmp_path / "p.txt").write_text('{"q": "one", "id": 1}\n\n{"q": "two é"}\n')
    assert cli.read_inputs(str(tmp_path / "p.txt"), field="q") == ["one", "two é"]   # --field: JSON lines
    (tmp_path / "p.jsonl").write_text('{"input": "one", "id": 1}\n\n{"input": "two é"}\n')
    assert cli.read_inputs(str(tmp_path / "p.jsonl")) == ["one", "two é"]


@pytest.mark.parametrize("given, want", [((), "/corpora/glue"), (("eval.data_dir='/elsewhere'",), "/elsewhere")])
def test_eval_of_a_training_config_reads_its_data_where_training_did(clean_gin_state, given, want):
    """A recipe that binds only `train.data_dir = %DATA_DIR` (the ULMFiT LM fine-tuning config) is
    evaluated by `t5lite eval` from that folder, with its training objective; `eval.data_dir` given wins."""
    from t5lite import gin_checks
    from t5lite.cli.gin_flags import from_training_config, parse_gin
    from t5lite.infer.evaluation import evaluate
    parse_gin(["configs/local/ulmfit_tiny_lm_finetune_sst2.gin"],
              ["DATA_DIR='/corpora/glue'", "TEXT_DATA_DIR='/corpora'", "MODEL_DIR='/runs/lm'", *given],
              required_macros=(), entry=("eval", evaluate), base_file="gin/eval.gin")
    from_training_config("eval", ("objective", "data_dir"))
    assert gin_checks.bound_value("eval.data_dir") == want
    assert gin_checks.is_bound("eval.objective")
