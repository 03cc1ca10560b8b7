"""A diverged model's outputs never pass as results: `infer`, `eval`, `embed` and the analysis
commands stop in one line naming the checkpoint and its step (exit code 2) and write nothing, and
no JSON t5lite writes holds NaN or Infinity (t5lite.finite)."""
import json
import math

import gin
import numpy as np
import pytest

from conftest import REPO, TINY_LENGTHS, TINY_TASK, shared_data_dir, train_tiny
from t5lite import cli, finite
from t5lite.infer.evaluation import append_metrics, write_predictions
from t5lite.train import summaries

STEP = 7


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _diverged(run, config, params=None, module=None) -> str:
    """`run` with `config` and one checkpoint (step 7) holding `params` (default: random ones around
    1e9 shaped as `module`'s), as the last finite checkpoint of a run AdamW drove apart does: finite
    weights, non-finite outputs."""
    import jax
    import jax.numpy as jnp
    from t5lite.infer.predict import abstract_params
    from t5lite.models.config import save_config
    from t5lite.train.checkpoints import Checkpointer
    if params is None:
        rng = np.random.default_rng(0)
        params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 1e9, s.shape), s.dtype),
                              abstract_params(config, module=module))
    ckpt = Checkpointer(str(run / "checkpoints"), save_every=1, async_save=False)
    ckpt.save(STEP, {"params": params}, {}, force=True)
    ckpt.close()
    save_config(config, str(run / "model_config.json"))
    return str(run)


@pytest.fixture(scope="module")
def diverged_run(tmp_path_factory) -> str:
    from t5lite.models import get_config
    return _diverged(tmp_path_factory.mktemp("diverged") / "run", get_config("t5_tiny"))


def _refused(capsys, *argv) -> str:
    """Runs `t5lite ARGV`, expecting exit code 2; its one error line."""
    with pytest.raises(SystemExit) as exited:
        cli.main(list(argv))
    captured = capsys.readouterr()
    assert exited.value.code == 2
    assert "NaN" not in captured.out and "Infinity" not in captured.out
    lines = [line for line in captured.err.splitlines() if line.startswith("t5lite: error:")]
    assert len(lines) == 1, captured.err
    return lines[0]


def _names_the_checkpoint(line: str, run: str, what: str) -> None:
    assert f"{run}/checkpoints/{STEP} (step {STEP}): the model's {what} are not finite" in line
    assert "earlier checkpoint" in line


@pytest.mark.parametrize("to_file", [True, False], ids=["output_file", "stdout"])
def test_infer_of_a_diverged_run_is_refused_and_writes_nothing(diverged_run, tmp_path, capsys, to_file):
    output = tmp_path / "predictions.jsonl"
    line = _refused(capsys, "infer", f"--gin.CHECKPOINT_PATH='{diverged_run}'",
                    *([f"--output={output}"] if to_file else []), "a fine film", "another one")
    _names_the_checkpoint(line, diverged_run, "scores")
    assert not output.exists()


def test_eval_of_a_diverged_run_is_refused_and_writes_nothing(diverged_run, tmp_path, capsys):
    out = tmp_path / "eval"
    line = _refused(capsys, "eval", f"--gin.CHECKPOINT_PATH='{diverged_run}'",
                    f"--gin.MIXTURE_OR_TASK_NAME='{TINY_TASK}'", f"--gin.TASK_FEATURE_LENGTHS={TINY_LENGTHS}",
                    "--gin.eval.max_examples=4", f"--gin.eval.output_dir='{out}'")
    _names_the_checkpoint(line, diverged_run, "log-likelihoods of the targets")
    assert not list(out.rglob("*.jsonl"))


def test_embed_of_a_diverged_run_is_refused_and_writes_nothing(diverged_run, tmp_path, capsys):
    output = tmp_path / "embeddings.npy"
    line = _refused(capsys, "embed", f"--gin.CHECKPOINT_PATH='{diverged_run}'", f"--output={output}",
                    "a fine film")
    _names_the_checkpoint(line, diverged_run, "embeddings")
    assert not output.exists()


def test_neighbours_of_a_diverged_run_are_refused_and_write_nothing(diverged_run, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the film is fine .\nthe play is long .\n")
    out = tmp_path / "analysis"
    line = _refused(capsys, "probe", "--model", diverged_run, "--neighbours", "the", "--corpus", str(corpus),
                    "--out", str(out))
    _names_the_checkpoint(line, diverged_run, "hidden states")
    assert not list(out.glob("*.json"))


def test_the_shared_json_writer_refuses_nan_and_infinity(tmp_path):
    for value in (math.nan, math.inf, -math.inf, np.float32("nan"), [np.float64("inf")]):
        with pytest.raises(ValueError, match="not JSON compliant"):
            finite.dumps({"score": value})
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_predictions(str(tmp_path / "p.jsonl"), [{"input": "x", "score": np.float32("nan")}])
    assert finite.dumps({"score": -1.5}) == '{"score": -1.5}'


def _strict_lines(path) -> list[dict]:
    """A JSON-lines file parsed as standard JSON (no NaN / Infinity constants)."""
    def refuse(constant):
        raise AssertionError(f"{path} holds {constant}")
    return [json.loads(line, parse_constant=refuse) for line in open(path)]


def test_an_undefined_metric_is_null_and_flagged_in_eval_metrics(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_metrics(str(path), {"step": 3, "pearson_corrcoef": math.nan, "accuracy": 50.0})
    assert _strict_lines(path) == [{"step": 3, "pearson_corrcoef": None, "accuracy": 50.0,
                                    "non_finite": {"pearson_corrcoef": "NaN"}}]


@pytest.mark.parametrize("log_every", [1, 4], ids=["at_a_log_step", "at_a_save_step_between_logs"])
def test_a_training_run_that_diverges_logs_its_non_finite_step_validly(tmp_path, micro_config, log_every):
    """Found at a log step or at a checkpoint step between them (step 3 of a run logging every 4),
    the non-finite step gets its metrics line before the run stops."""
    import optax
    from t5lite.train.trainer import NonFiniteLossError
    schedule = optax.constant_schedule(1e30)
    with pytest.raises(NonFiniteLossError, match="not finite, so not saved"):
        train_tiny(tmp_path, micro_config, 6, optimizer=(optax.sgd(schedule), schedule), log_every=log_every)
    records = _strict_lines(tmp_path / "metrics.jsonl")
    last = records[-1]
    assert last["loss"] is None and last["non_finite"]["loss"] in ("NaN", "Infinity", "-Infinity")
    assert {"steps_per_sec", "cost_flops"} <= set(last)   # a line as every log step's
    assert all(r["step"] < last["step"] and math.isfinite(r["loss"]) for r in records[:-1])
    read_back = summaries.read_metrics(str(tmp_path / "metrics.jsonl"))[-1]   # as logged: a float again
    assert not math.isfinite(read_back["loss"]) and "non_finite" not in read_back


def test_fewshot_eval_of_a_diverged_run_is_refused_and_writes_nothing(tmp_path, capsys):
    from t5lite.models import get_config
    run = _diverged(tmp_path / "run", get_config("gpt2_tiny", vocab_size=2176))
    out = tmp_path / "eval"
    line = _refused(capsys, "eval", f"--gin.CHECKPOINT_PATH='{run}'", "--gin.eval.fewshot=@FewShot()",
                    "--gin.MIXTURE_OR_TASK_NAME='glue_sst2'", f"--gin.eval.data_dir='{shared_data_dir() / 'glue'}'",
                    "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}", "--gin.eval.max_examples=2",
                    "--gin.eval.batch_size=2", f"--gin.eval.output_dir='{out}'")
    _names_the_checkpoint(line, run, "log-likelihoods of the labels")
    assert not out.exists() or not list(out.rglob("*.jsonl"))


# An AWD-LSTM word LM (vocabulary of 512 words of the embedded corpus); its `eval` as for a trained one.
AWD_LSTM = [f"--gin_file={REPO / 'configs/local/awd_lstm_tiny_wikitext2.gin'}", "--gin.DATA_DIR=None",
            "--gin.MIXTURE_OR_TASK_NAME='embedded_docs_lines'", "--gin.word_vocabulary.task='embedded_docs_lines'",
            "--gin.word_vocabulary.split='train'", "--gin.word_vocabulary.size=512", "--gin.model_config.vocab_size=512",
            "--gin.TASK_FEATURE_LENGTHS={'targets': 16}", "--gin.BATCH_SIZE=2"]


@pytest.fixture(scope="module")
def diverged_awd_lstm_run(tmp_path_factory) -> str:
    """Huge weights: a finite loss whose exp (the perplexity) overflows."""
    import dataclasses
    from t5lite.models import get_config
    from t5lite.objectives.recurrent import AWDLSTMLMObjective
    gin.parse_config(["word_vocabulary.task = 'embedded_docs_lines'", "word_vocabulary.split = 'train'",
                      "word_vocabulary.size = 512"])
    config = dataclasses.replace(get_config("awd_lstm_tiny"), vocab_size=512)
    run = _diverged(tmp_path_factory.mktemp("awd_lstm") / "run", config,
                    module=AWDLSTMLMObjective(stream_rows=2).build_model(config))
    gin.clear_config()
    return run


@pytest.mark.parametrize("evaluator", [[], ["--gin.AWDLSTMLMObjective.stream_rows=0",
                                            "--gin.train.feature_converter='word_lm'"]],
                         ids=["stream_perplexity", "sentence_perplexity"])   # the latter: ELMo's too
def test_perplexity_eval_of_a_diverged_word_lm_is_refused_and_writes_nothing(diverged_awd_lstm_run, evaluator,
                                                                            tmp_path, capsys):
    out = tmp_path / "eval"
    line = _refused(capsys, "eval", *AWD_LSTM, *evaluator, f"--gin.CHECKPOINT_PATH='{diverged_awd_lstm_run}'",
                    "--gin.eval.max_examples=8", "--gin.eval.batch_size=2", f"--gin.eval.output_dir='{out}'")
    _names_the_checkpoint(line, diverged_awd_lstm_run, "perplexities")
    assert not out.exists() or not list(out.rglob("*.jsonl"))


def test_elmo_neighbours_of_a_diverged_run_are_refused_and_write_nothing(tmp_path, capsys):
    import jax
    from t5lite.interop import elmo
    elmo_files = shared_data_dir() / "elmo"
    module, variables = elmo.load(str(elmo_files / "options.json"), str(elmo_files / "lm_weights.hdf5"))
    run = _diverged(tmp_path / "run", module.config, {"bilm": jax.tree.map(lambda x: x * 1e9, variables["params"])})
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the film is fine .\nthe play is long .\n")
    out = tmp_path / "analysis"
    line = _refused(capsys, "probe", "--model", run, "--neighbours", "the", "--corpus", str(corpus), "--out", str(out))
    _names_the_checkpoint(line, run, "hidden states")
    assert not list(out.glob("*.json"))


def test_cost_json_holds_no_infinity(tmp_path):
    """A setting of infinity (gin reads 1e999 as one) is refused by name; cost.json is written by
    the JSON writer that refuses NaN and infinity."""
    from t5lite.errors import ConfigError
    from t5lite.train import cost
    with pytest.raises(ConfigError, match=r"cost.device_power_watts=inf: must be a finite number >= 0"):
        cost.cost_model(device_power_watts=1e999, device_kind="cpu")
    with pytest.raises(ConfigError, match=r"cost.pue=nan"):
        cost.cost_model(pue=math.nan, device_kind="cpu")
    model = cost.CostModel("cpu", 1, math.inf, 1.0, 0.5, 1.0, "test")   # built around the check
    with pytest.raises(ValueError, match="not JSON compliant"):
        cost.CostMeter(str(tmp_path), model).write(step=1)
    assert not (tmp_path / "cost.json").exists()
