"""`t5lite eval --forgetting` (t5lite.infer.forgetting) and the forgetting frontier
(t5lite.experiments.forgetting), on a bert_tiny MLM base fine-tuned 2 steps in full and with LoRA."""
import json
from pathlib import Path

import gin
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from conftest import REPO, shared_data_dir

MLM = [str(REPO / "configs/local/bert_tiny_pretrain.gin"), str(REPO / "gin/objectives/bert_mlm.gin")]
SST2 = str(REPO / "configs/local/bert_tiny_finetune_sst2.gin")


def _train(files, bindings):
    from t5lite import cli
    from t5lite.train import trainer
    gin.clear_config()
    cli.parse_gin(files, bindings, entry=("train", trainer.train))
    trainer.train(progress=False)
    gin.clear_config()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(base, full, lora, adapters): an MLM run of 2 steps and three 2-step SST-2 runs from it."""
    root = tmp_path_factory.mktemp("forgetting")
    base, full, lora, adapters = (str(root / n) for n in ("base", "full", "lora", "adapters"))
    _train(MLM, [f"MODEL_DIR = '{base}'", "TRAIN_STEPS = 2", "BATCH_SIZE = 4", "train.checkpoint_every = 2"])
    common = [f"INITIAL_CHECKPOINT_PATH = '{base}'", f"DATA_DIR = '{shared_data_dir() / 'glue'}'", "TRAIN_STEPS = 2",
              "EVAL_EVERY = 0", "BATCH_SIZE = 4", "train.checkpoint_every = 2", "warmup_cosine.warmup_steps = 1",
              "warmup_cosine.peak_learning_rate = 0.05"]   # large, so 2 steps move every weight visibly
    _train([SST2], [f"MODEL_DIR = '{full}'", *common])
    _train([SST2, str(REPO / "gin/peft/lora.gin")], [f"MODEL_DIR = '{lora}'", *common])
    _train([SST2, str(REPO / "gin/peft/houlsby.gin")], [f"MODEL_DIR = '{adapters}'", *common])
    return base, full, lora, adapters


def _raw(run, step=2):
    """A checkpoint's stored params read by orbax itself, not through t5lite's reader."""
    import orbax.checkpoint as ocp
    state = ocp.PyTreeCheckpointer().restore(f"{run}/checkpoints/{step}/state")
    return flatten_dict(state["params"])


def _base_params(base):
    from t5lite.infer import checkpoint_reader
    return checkpoint_reader.restore_params(f"{base}/checkpoints/2", jax_abstract(_raw(base)))


def jax_abstract(flat):
    import jax
    from flax.traverse_util import unflatten_dict
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return unflatten_dict({p: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=device)
                           for p, x in flat.items()})


def test_a_full_run_grafts_its_backbone_and_keeps_the_base_mlm_head(runs):
    from t5lite.infer import forgetting
    base, full = runs[:2]
    assert forgetting.base_of(full) == base
    grafted = flatten_dict(forgetting.grafted(_base_params(base), full))
    tuned, original = _raw(full), _raw(base)
    for path, value in grafted.items():
        expected = tuned.get(("backbone",) + path, original[path])
        np.testing.assert_array_equal(np.asarray(value), np.asarray(expected), err_msg="/".join(path))
    moved = [p for p in grafted if ("backbone",) + p in tuned and not np.array_equal(tuned[("backbone",) + p], original[p])]
    assert len(moved) > 20   # the fine-tuning changed the encoder, so the graft is not the base again
    assert forgetting.kept_from_base(base, full) == ["mlm_head", "sentence_head"]


def test_a_lora_run_grafts_its_merged_weights(runs):
    """The LoRA update W + (alpha / r) A B, peft's LoraLayer.get_delta_weight (peft/tuners/lora/layer.py:
    transpose(B @ A) * scaling) in the (in, out) layout, from the run's trained A and B read by orbax."""
    from t5lite.infer import forgetting
    base, lora = runs[0], runs[2]
    assert forgetting.base_of(lora).rstrip("/").startswith(base)
    grafted = flatten_dict(forgetting.grafted(_base_params(base), lora))
    original = _raw(base)
    import orbax.checkpoint as ocp
    trained = flatten_dict(ocp.PyTreeCheckpointer().restore(f"{lora}/checkpoints/2/state"))
    factors = {p[:-1]: {} for p in trained if p[-1] in ("lora_a", "lora_b")}
    for p, x in trained.items():
        if p[-1] in ("lora_a", "lora_b"):
            factors[p[:-1]][p[-1]] = np.asarray(x)
    assert len(factors) == 4   # query and value of both layers
    matched = 0
    for path, value in grafted.items():
        key = next((k for k in factors if path[-1] == "kernel" and k[-len(path):] == ("backbone",) + path[:-1]), None)
        expected = np.asarray(original[path], np.float64)
        if key is not None:
            a, b = factors[key]["lora_a"], factors[key]["lora_b"]
            expected = expected + (a.astype(np.float64) @ b.reshape(b.shape[0], -1)).reshape(expected.shape) * (8.0 / 8)
            assert not np.allclose(expected, original[path])
            matched += 1
        np.testing.assert_allclose(np.asarray(value), expected, rtol=1e-5, atol=1e-6, err_msg="/".join(path))
    assert matched == 4


def test_eval_forgetting_prints_base_and_run_side_by_side(runs, capsys):
    from t5lite import cli
    from t5lite.infer.evaluation import evaluate
    base, full = runs[:2]
    gin.clear_config()
    cli.main(["eval", "--forgetting", *(f"--gin_file={f}" for f in MLM), f"--gin.CHECKPOINT_PATH='{full}'",
              "--gin.eval.max_examples=8"])
    out = capsys.readouterr().out
    assert f"forgetting of {full} on embedded_docs_bert_mlm (validation), base {base}:" in out
    assert "from the base (the run has none): mlm_head, sentence_head" in out
    report = json.loads((Path(full) / "eval" / "forgetting.json").read_text())
    line = next(x for x in out.splitlines() if x.strip().startswith("mlm_loss"))
    assert f"change {report['run_metrics']['mlm_loss'] - report['base_metrics']['mlm_loss']:+.4g}" in line
    assert report["run_metrics"]["mlm_loss"] != report["base_metrics"]["mlm_loss"]
    # the base's number is plain `t5lite eval` of the base
    gin.clear_config()
    from t5lite.cli.gin_flags import parse_gin
    parse_gin(MLM, [f"CHECKPOINT_PATH = '{base}'", "eval.max_examples = 8"], required_macros=(),
              entry=("eval", evaluate), base_file="gin/eval.gin")
    gin.bind_parameter("eval.model", None)
    gin.bind_parameter("eval.objective", gin.query_parameter("train.objective"))
    assert evaluate()["mlm_loss"] == pytest.approx(report["base_metrics"]["mlm_loss"], rel=1e-6)
    gin.clear_config()


def test_a_run_without_a_base_is_refused_in_one_line(bert_tiny_sst2_run, capsys):
    from t5lite import cli
    gin.clear_config()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["eval", "--forgetting", *(f"--gin_file={f}" for f in MLM), f"--gin.CHECKPOINT_PATH='{bert_tiny_sst2_run}'"])
    gin.clear_config()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "names no base" in err and "--forgetting_base" in err


def test_frontier_intervals_match_scipy_and_the_dominated_method_is_off_it():
    from scipy import stats
    from t5lite.experiments import forgetting
    runs = {"full": [(0.9, 80.0), (1.1, 82.0), (1.0, 81.0)], "lora": [(0.1, 78.0), (0.2, 77.0), (0.15, 79.0)],
            "low": [(0.5, 70.0), (0.6, 71.0), (0.55, 69.0)], "one": [(2.0, 60.0)]}
    summary = forgetting.summarize(runs)
    for name, pairs in runs.items():
        for axis, values in (("forgetting", [f for f, _ in pairs]), ("accuracy", [a for _, a in pairs])):
            mean, low, high = summary[name][axis]
            assert mean == pytest.approx(np.mean(values))
            if len(values) > 1:
                expected = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
                assert (low, high) == pytest.approx(expected)
    assert {n for n, r in summary.items() if r["on_frontier"]} == {"full", "lora"}


def test_frontier_plot_is_written(tmp_path):
    from t5lite.experiments import forgetting
    summary = forgetting.summarize({"full": [(1.0, 80.0), (1.2, 81.0)], "lora": [(0.1, 75.0), (0.2, 76.0)]})
    forgetting.plot(summary, str(tmp_path / "f.png"), "synthetic")
    assert (tmp_path / "f.png").stat().st_size > 1000


def test_an_adapter_run_adds_its_adapters_to_the_base_model(runs):
    """Adapters do not merge: the grafted params are the base's (the backbone frozen) with the run's
    adapter weights beside them, as orbax reads them (the layers apply adapters whose params are present)."""
    import orbax.checkpoint as ocp
    from t5lite.infer import forgetting
    base, adapters = runs[0], runs[3]
    grafted = flatten_dict(forgetting.grafted(_base_params(base), adapters))
    original = _raw(base)
    trained = {p[p.index("backbone") + 1:]: np.asarray(x) for p, x in
               flatten_dict(ocp.PyTreeCheckpointer().restore(f"{adapters}/checkpoints/2/state")).items()
               if "houlsby" in p}
    assert len(trained) == 16   # down and up, kernel and bias, after attention and MLP, in 2 layers
    assert set(grafted) == set(original) | set(trained)
    for path, value in grafted.items():
        np.testing.assert_array_equal(np.asarray(value), trained[path] if path in trained else original[path])


def test_the_base_is_read_from_a_config_gin_that_wraps_a_long_path(tmp_path):
    # gin's operative config puts a value too long for its line after a backslash continuation.
    from t5lite.infer import forgetting
    run = tmp_path / "run"
    (run / "checkpoints" / "2" / "state").mkdir(parents=True)   # a saved step, as base_of finds its run
    long_base = "/" + "/".join(["a_rather_long_folder_name"] * 4) + "/base"
    (run / "config.gin").write_text(f"INITIAL_CHECKPOINT_PATH = \\\n    '{long_base}'\n"
                                    "train.initial_checkpoint_path = %INITIAL_CHECKPOINT_PATH\n")
    assert forgetting.base_of(str(run)) == long_base


def _hf_masked_lm_loss(config, params, batch, out_dir) -> tuple[float, np.ndarray]:
    """BERT's masked-LM loss as transformers computes it (`BertForMaskedLM.forward`: CrossEntropyLoss
    over the tokens whose label is not -100, a mean over those) on `params` exported by
    t5lite.interop.hf, for the evaluation's batch: labels are its targets where its loss weight is 1."""
    torch = pytest.importorskip("torch", reason="the transformers reference runs on torch")
    transformers = pytest.importorskip("transformers", reason="the reference is transformers' BertForMaskedLM")
    from t5lite.interop import hf
    model = transformers.BertForMaskedLM.from_pretrained(hf.save(config, {"params": params}, out_dir)).eval()
    tokens, weights = batch["encoder_input_tokens"], batch["encoder_loss_weights"]
    labels = np.where(weights > 0, batch["encoder_target_tokens"], -100)
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(tokens, dtype=torch.long),
                    attention_mask=torch.as_tensor(tokens != 0, dtype=torch.long),
                    token_type_ids=torch.as_tensor(batch["token_type_ids"], dtype=torch.long),
                    labels=torch.as_tensor(labels, dtype=torch.long))
    return float(out.loss), out.logits.numpy()


TOLERANCE = 2e-6   # float32 logits of XLA and torch: the losses agreed to 1.5e-7 (relative)


def test_forgetting_mlm_losses_are_transformers_masked_lm_loss(runs, tmp_path):
    """Both MLM losses `eval --forgetting` reports, re-derived outside t5lite: the held-out batch it
    scores through transformers' BertForMaskedLM holding the base's weights and the grafted run's."""
    from t5lite import cli
    from t5lite.cli.gin_flags import parse_gin
    from t5lite.data import catalog
    from t5lite.infer import forgetting, predict
    from t5lite.infer.evaluation import evaluate
    from t5lite.objectives.encoder import MlmObjective
    base, full = runs[:2]
    gin.clear_config()
    cli.main(["eval", "--forgetting", *(f"--gin_file={f}" for f in MLM), f"--gin.CHECKPOINT_PATH='{full}'",
              "--gin.eval.max_examples=8"])
    report = json.loads((Path(full) / "eval" / "forgetting.json").read_text())
    gin.clear_config()
    parse_gin(MLM, [f"CHECKPOINT_PATH = '{base}'"], required_macros=(), entry=("eval", evaluate),
              base_file="gin/eval.gin")
    task = catalog.get_task_or_mixture(gin.query_parameter("%MIXTURE_OR_TASK_NAME"))
    evaluator = MlmObjective().evaluators(task, "validation", gin.query_parameter("%TASK_FEATURE_LENGTHS"),
                                          max_examples=8)[task.name]
    gin.clear_config()
    (batch,) = evaluator.batches   # the 8 examples in one batch of 32
    config = predict.model_config_of(base, None)
    params = {"base": _base_params(base)}
    params["run"] = forgetting.grafted(params["base"], full)
    weights = batch["encoder_loss_weights"] > 0
    for name, reported in (("base", report["base_metrics"]), ("run", report["run_metrics"])):
        loss, logits = _hf_masked_lm_loss(config, params[name], batch, str(tmp_path / name))
        assert reported["mlm_loss"] == pytest.approx(loss, rel=TOLERANCE)
        hits = logits.argmax(-1)[weights] == batch["encoder_target_tokens"][weights]
        assert reported["mlm_accuracy"] == pytest.approx(hits.mean(), abs=1e-9)
        # The tolerance tells the masked tokens' mean from the mean over every real token, or of rows.
        log_p = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
        token_loss = -np.take_along_axis(log_p, batch["encoder_target_tokens"][..., None], -1)[..., 0]
        assert np.mean(token_loss[weights]) == pytest.approx(loss, rel=TOLERANCE)
        real = batch["encoder_input_tokens"] != 0
        per_row = np.sum(token_loss * weights, 1) / np.maximum(np.sum(weights, 1), 1)
        for wrong in (np.mean(token_loss[real]), np.mean(per_row[weights.any(1)])):
            assert abs(wrong - loss) > 50 * TOLERANCE * loss


@pytest.mark.parametrize("method, name", [("lora", "warmup_cosine.peak_learning_rate"),
                                          ("full_low", "warmup_cosine.peak_learning_rate"),
                                          ("ulmfit", "slanted_triangular.max_learning_rate")])
def test_benchmark_rates_reach_the_rate_the_run_trains_with(method, name):
    """`benchmarks/forgetting.py --rates METHOD=RATE`: the flags it adds after the method's own win,
    as gin reads the command line the fine-tuning gets."""
    from conftest import load_benchmark

    from t5lite import cli
    from t5lite.train import trainer
    bench = load_benchmark("forgetting")
    flags = [*bench.METHODS[method], *bench.rate_flags(method, bench.parse_rates(f"{method}=2e-2")[method])]
    files = [bench.FINETUNE, *(f.split("=", 1)[1] for f in flags if f.startswith("--gin_file="))]
    bindings = ["MODEL_DIR = 'run'", "INITIAL_CHECKPOINT_PATH = None", "DATA_DIR = 'data'",
                *(f[len("--gin."):] for f in flags if f.startswith("--gin.") and not f.startswith("--gin_file"))]
    gin.clear_config()
    try:
        cli.parse_gin([str(REPO / f) for f in files], bindings, entry=("train", trainer.train))
        assert gin.query_parameter(name) == 2e-2
    finally:
        gin.clear_config()


@pytest.mark.parametrize("text", ["lora=fast", "lora=-1e-3", "laura=1e-2", "lora"])
def test_benchmark_refuses_a_rate_it_cannot_use_naming_it(text):
    from conftest import load_benchmark
    with pytest.raises(SystemExit, match=f"--rates {text.split('=')[0]}"):
        load_benchmark("forgetting").parse_rates(text)
