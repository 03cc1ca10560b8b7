"""Knowledge distillation: the losses against numpy, torch and Hugging Face's DistilBERT distiller,
student initialisation from teacher layers, and a tiny end-to-end run with a frozen teacher."""
from __future__ import annotations

import itertools
import json
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, train_tiny

from t5lite import models
from t5lite.data import TaskRegistry, get_task
from t5lite.infer import predict
from t5lite.errors import ConfigError
from t5lite.objectives import distillation
from t5lite.objectives.distillation import DistillationObjective
from t5lite.objectives.encoder import MlmObjective
from t5lite.objectives.base import LossConfig


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_kd_loss_equals_the_formula_in_numpy_and_torch_kldiv_batchmean():
    rng = np.random.default_rng(0)
    s, t = rng.normal(size=(2, 7, 11)) * 3, rng.normal(size=(2, 7, 11)) * 3
    T = 2.5
    ours = float(jnp.mean(distillation.kd_per_position(jnp.asarray(s, jnp.float32), jnp.asarray(t, jnp.float32), T)))
    p_t = np.exp(_np_log_softmax(t / T))
    by_formula = np.sum(p_t * (np.log(p_t) - _np_log_softmax(s / T)), -1).mean() * T ** 2
    assert_close(ours, by_formula, rtol=1e-5)
    torch = pytest.importorskip("torch", reason="the KLDivLoss check needs torch (extras 'hf')")
    flat_s, flat_t = (torch.tensor(x.reshape(-1, 11)) for x in (s, t))
    theirs = torch.nn.KLDivLoss(reduction="batchmean")(torch.log_softmax(flat_s / T, -1),
                                                        torch.softmax(flat_t / T, -1)) * T ** 2
    assert_close(ours, theirs.item(), rtol=1e-5)


def _mlm_batch(rng, batch=3, length=12, vocab=1000):
    tokens = rng.integers(5, vocab, size=(batch, length)).astype(np.int32)
    tokens[0, 9:] = 0          # padding (bert_tiny's pad id is 0)
    tokens[2, 6:] = 0
    weights = (rng.random((batch, length)) < 0.3) & (tokens != 0)
    weights[:, 1] = True       # every row has a target
    targets = np.where(weights, rng.integers(5, vocab, size=(batch, length)), 0).astype(np.int32)
    return {"encoder_input_tokens": jnp.asarray(tokens), "encoder_target_tokens": jnp.asarray(targets),
            "encoder_loss_weights": jnp.asarray(weights.astype(np.int32))}


def _hf_distiller_loss(torch, s_logits, t_logits, s_hidden, t_hidden, attention_mask, lm_labels, T, a):
    """transformers research_projects/distillation/distiller.py `Distiller.step` (mlm=True,
    restrict_ce_to_mask=False), written out in torch."""
    nn = torch.nn
    mask = attention_mask.unsqueeze(-1).expand_as(s_logits)
    s_slct = torch.masked_select(s_logits, mask).view(-1, s_logits.size(-1))
    t_slct = torch.masked_select(t_logits, mask).view(-1, s_logits.size(-1))
    loss_ce = nn.KLDivLoss(reduction="batchmean")(nn.functional.log_softmax(s_slct / T, dim=-1),
                                                  nn.functional.softmax(t_slct / T, dim=-1)) * T ** 2
    loss = a["ce"] * loss_ce
    loss_mlm = nn.CrossEntropyLoss(ignore_index=-100)(s_logits.view(-1, s_logits.size(-1)), lm_labels.view(-1))
    loss = loss + a["mlm"] * loss_mlm
    loss = loss + a["mse"] * nn.MSELoss(reduction="sum")(s_slct, t_slct) / s_slct.size(0)
    hmask = attention_mask.unsqueeze(-1).expand_as(s_hidden)
    dim = s_hidden.size(-1)
    s_h = torch.masked_select(s_hidden, hmask).view(-1, dim)
    t_h = torch.masked_select(t_hidden, hmask).view(-1, dim)
    target = s_h.new(s_h.size(0)).fill_(1)
    loss = loss + a["cos"] * nn.CosineEmbeddingLoss(reduction="mean")(s_h, t_h, target)
    return loss


def _tiny_bert(layers, **more):
    return models.get_config("bert_tiny", num_encoder_layers=layers, dropout_rate=0.0, **more)


def _teacher_objective(teacher_config, teacher_params, **kwargs):
    objective = DistillationObjective(MlmObjective(), teacher_path="unused", **kwargs)
    objective.teacher_config = teacher_config
    objective.teacher_module = objective.objective.build_model(teacher_config)
    return objective, teacher_params


def test_distilbert_loss_equals_a_torch_reimplementation_of_the_hf_distiller():
    torch = pytest.importorskip("torch", reason="the distiller reference needs torch (extras 'hf')")
    rng = np.random.default_rng(1)
    batch = _mlm_batch(rng)
    teacher_cfg, student_cfg = _tiny_bert(4), _tiny_bert(2)
    tokens = batch["encoder_input_tokens"]
    teacher_module, student_module = models.build(teacher_cfg), models.build(student_cfg)
    t_params = teacher_module.init(jax.random.key(0), encoder_input_tokens=tokens)["params"]
    s_params = student_module.init(jax.random.key(1), encoder_input_tokens=tokens)["params"]
    T, alphas = 2.0, {"ce": 5.0, "mlm": 2.0, "mse": 0.3, "cos": 1.0}
    objective, frozen = _teacher_objective(teacher_cfg, t_params, temperature=T, alpha_ce=alphas["ce"],
                                           alpha_hard=alphas["mlm"], alpha_mse=alphas["mse"], alpha_cos=alphas["cos"],
                                           positions="inputs")
    loss_cfg = LossConfig(z_loss=0.0)
    module = objective.build_model(student_cfg)
    normalizers = objective.normalizers(batch, loss_cfg)
    ours, metrics = objective.loss_and_metrics(module, s_params, batch, jax.random.key(2), normalizers, loss_cfg,
                                               frozen=frozen)
    # The same logits and final hidden states, straight from each model.
    as_torch = lambda x: torch.tensor(np.asarray(x, np.float32))
    s_logits, t_logits = (m.apply({"params": p}, encoder_input_tokens=tokens)
                          for m, p in ((student_module, s_params), (teacher_module, t_params)))
    s_hidden, t_hidden = (m.apply({"params": p}, encoder_input_tokens=tokens, method="encode")
                          for m, p in ((student_module, s_params), (teacher_module, t_params)))
    labels = np.where(np.asarray(batch["encoder_loss_weights"]) > 0, np.asarray(batch["encoder_target_tokens"]), -100)
    theirs = _hf_distiller_loss(torch, as_torch(s_logits), as_torch(t_logits), as_torch(s_hidden), as_torch(t_hidden),
                                torch.tensor(np.asarray(tokens) != 0), torch.tensor(labels.astype(np.int64)), T, alphas)
    assert_close(float(ours), theirs.item(), rtol=2e-5)
    assert float(metrics["loss"]) == float(ours)


def test_tinybert_losses_equal_numpy():
    rng = np.random.default_rng(2)
    t_scores = [rng.normal(size=(2, 4, 5, 5)).astype(np.float32) for _ in range(6)]
    s_scores = [rng.normal(size=(2, 4, 5, 5)).astype(np.float32) for _ in range(3)]
    for x in t_scores + s_scores:
        x[:, :, :, 4] = -1e10    # a masked key
    t_hidden = [rng.normal(size=(2, 5, 8)).astype(np.float32) for _ in range(7)]   # embeddings + 6 layers
    s_hidden = [rng.normal(size=(2, 5, 6)).astype(np.float32) for _ in range(4)]   # embeddings + 3 layers
    projection = {"kernel": rng.normal(size=(6, 8)).astype(np.float32), "bias": rng.normal(size=8).astype(np.float32)}
    # TinyBERT's task_distill.py: attention of student layer i vs teacher i*k + k - 1, entries <= -100 -> 0;
    # hidden states j (0 = embeddings) vs teacher j*k through the student's fit_dense; MSE means, summed.
    zero = lambda x: np.where(x <= -100, 0.0, x)
    k = 2
    want_att = sum(np.mean((zero(s) - zero(t_scores[i * k + k - 1])) ** 2) for i, s in enumerate(s_scores))
    want_rep = sum(np.mean((s @ projection["kernel"] + projection["bias"] - t_hidden[j * k]) ** 2)
                   for j, s in enumerate(s_hidden))
    assert_close(float(distillation.tinybert_attention_loss(s_scores, t_scores)), want_att, rtol=1e-5)
    assert_close(float(distillation.tinybert_hidden_loss(s_hidden, t_hidden, projection)), want_rep, rtol=1e-5)
    with pytest.raises(ConfigError, match="multiple"):
        distillation.tinybert_attention_loss(s_scores + s_scores[:1], t_scores)   # 4 student layers, 6 teacher


def _tinybert_fit_dense(torch, hidden_size, fit_size, initializer_range):
    """TinyBERT's projection at init, transcribed from huawei-noah/Pretrained-Language-Model,
    TinyBERT/transformer/modeling.py: TinyBertForSequenceClassification.__init__ builds
    `self.fit_dense = nn.Linear(config.hidden_size, fit_size)` then `self.apply(self.init_bert_weights)`,
    and init_bert_weights does, for an nn.Linear, `module.weight.data.normal_(mean=0.0,
    std=self.config.initializer_range)` and `module.bias.data.zero_()` (BertConfig's
    initializer_range defaults to 0.02)."""
    torch.manual_seed(0)
    fit_dense = torch.nn.Linear(hidden_size, fit_size)
    fit_dense.weight.data.normal_(mean=0.0, std=initializer_range)
    fit_dense.bias.data.zero_()
    return fit_dense.weight.detach().numpy().T, fit_dense.bias.detach().numpy()


@pytest.mark.parametrize("student, initializer_range", [
    (models.get_config("t5_tiny", d_model=64), 0.02),      # no BERT-style init_std: BertConfig's 0.02
    (_tiny_bert(2, d_model=64, init_std=0.05), 0.05)])     # the student's own initializer range
def test_tinybert_projection_starts_as_tinyberts_fit_dense(student, initializer_range):
    """Same distribution as TinyBERT's fit_dense (two-sample Kolmogorov-Smirnov on 8192 weights,
    and the sample stddevs within 4%), bias exactly zero."""
    torch = pytest.importorskip("torch", reason="TinyBERT's init is torch's (extra 'hf')")
    from scipy import stats
    module = distillation.WithProjection(models.build(student), teacher_width=128)
    tokens = jnp.ones((1, 4), jnp.int32)
    params = flax.linen.unbox(module.init(jax.random.key(0), encoder_input_tokens=tokens,
                                          decoder_input_tokens=tokens))["params"][distillation.PROJECTION]
    weight, bias = _tinybert_fit_dense(torch, 64, 128, initializer_range)
    kernel = np.asarray(params["kernel"])
    assert kernel.shape == weight.shape == (64, 128)
    assert stats.ks_2samp(kernel.ravel(), weight.ravel()).pvalue > 1e-3
    assert_close(kernel.std(), weight.std(), rtol=0.04)
    np.testing.assert_array_equal(np.asarray(params["bias"]), bias)


def test_attention_scores_are_the_pre_softmax_scores_of_each_layer():
    cfg = _tiny_bert(2)
    module = models.build(cfg)
    tokens = jnp.asarray(np.random.default_rng(3).integers(5, 1000, size=(2, 6)), jnp.int32).at[1, 4:].set(0)
    params = flax.linen.unbox(module.init(jax.random.key(0), encoder_input_tokens=tokens))["params"]
    _, state = module.apply({"params": params}, encoder_input_tokens=tokens, mutable=["attention_scores"])
    hidden = module.apply({"params": params}, encoder_input_tokens=tokens, method="encode",
                          capture_intermediates=distillation._capture, mutable=["intermediates"])[1]
    x = np.asarray(hidden["intermediates"]["encoder"]["_embed"][0])     # layer 0's input (post-norm BERT)
    attn = params["encoder"]["layers_0"]["self_attention"]
    q = np.einsum("bld,dhk->bhlk", x, attn["query"]["kernel"]) + attn["query"]["bias"][None, :, None]
    kk = np.einsum("bld,dhk->bhlk", x, attn["key"]["kernel"]) + attn["key"]["bias"][None, :, None]
    want = np.einsum("bhqd,bhkd->bhqk", q, kk) / np.sqrt(cfg.head_dim)
    got = np.asarray(state["attention_scores"]["encoder"]["layers_0"]["self_attention"]["scores"][0])
    real = np.asarray(tokens != 0)
    real = real[:, None, :, None] & real[:, None, None, :]     # padding queries and keys are masked
    assert_close(np.where(real, got, 0.0), np.where(real, want, 0.0), rtol=1e-4)
    assert np.all(got[~np.broadcast_to(real, got.shape)] <= -1e9)


def test_student_init_takes_exactly_the_named_teacher_layers():
    teacher = models.build(_tiny_bert(12))
    tokens = jnp.ones((1, 4), jnp.int32)
    t_params = jax.device_get(flax.linen.unbox(teacher.init(jax.random.key(0), encoder_input_tokens=tokens))["params"])
    picked = distillation.select_layers(t_params, [0, 2, 4, 7, 9, 11])    # DistilBERT's
    student = models.build(_tiny_bert(6))
    s_abstract = flax.linen.unbox(jax.eval_shape(lambda: student.init(jax.random.key(0), encoder_input_tokens=tokens)))["params"]
    assert jax.tree.structure(picked) == jax.tree.structure(s_abstract)
    for i, j in enumerate([0, 2, 4, 7, 9, 11]):
        jax.tree.map(np.testing.assert_array_equal, picked["encoder"][f"layers_{i}"], t_params["encoder"][f"layers_{j}"])
    for name in t_params:
        if name != "encoder":
            jax.tree.map(np.testing.assert_array_equal, picked[name], t_params[name])
    # Scanned params: the stacked axis is indexed the same way.
    stacked = models.transformer.scan_params(t_params)
    again = models.transformer.unscan_params(distillation.select_layers(stacked, [0, 2, 4, 7, 9, 11]))
    jax.tree.map(np.testing.assert_array_equal, again, picked)
    with pytest.raises(ConfigError, match="not \\[12\\]"):
        distillation.select_layers(t_params, [0, 12])


def test_tiny_distillation_run_keeps_the_teacher_bit_identical_and_logs_its_cost(tmp_path):
    from t5lite.infer import checkpoint_reader
    teacher_cfg = models.get_config("t5_tiny", dropout_rate=0.0)
    train_tiny(tmp_path / "teacher", teacher_cfg, 2)
    student_cfg = models.get_config("t5_tiny", num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0)
    teacher_dir = str(tmp_path / "teacher")
    abstract = predict.abstract_params(teacher_cfg)
    before = jax.device_get(checkpoint_reader.restore_params(teacher_dir, abstract))
    objective = DistillationObjective(teacher_path=teacher_dir, student_layers=[1], alpha_cos=1.0,
                                      alpha_hidden=1.0, alpha_attention=1.0)
    loaded = []
    load = objective.load_frozen
    objective.load_frozen = lambda partitioner: loaded.append(load(partitioner)) or loaded[-1]
    last = train_tiny(tmp_path / "student", student_cfg, 3, objective=objective, initial_checkpoint_path=teacher_dir)
    for key in ("kd_loss", "hard_loss", "cos_loss", "hidden_loss", "attention_loss", "teacher_agreement"):
        assert np.isfinite(last[key]), key
    # The teacher's params, as read and as passed to every step, are unchanged; they are not in the
    # student's checkpoint nor its optimizer state.
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded[0]), before)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(checkpoint_reader.restore_params(teacher_dir, abstract)),
                 before)
    stored = checkpoint_reader.stored_param_names(str(tmp_path / "student"))
    assert stored == {"encoder", "decoder", "token_embedder", distillation.PROJECTION} - (
        set() if "token_embedder" in before else {"token_embedder"})
    records = [json.loads(line) for line in open(tmp_path / "student" / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[-1]["cost_flops"] > records[0]["cost_flops"] > 0


def test_student_layers_from_a_checkpoint_feed_the_student(tmp_path):
    from t5lite.infer import checkpoint_reader
    teacher_cfg = models.get_config("t5_tiny", dropout_rate=0.0)
    train_tiny(tmp_path / "teacher", teacher_cfg, 1)
    objective = DistillationObjective(teacher_path=None, student_layers={"encoder": [1], "decoder": [0]})
    student_cfg = models.get_config("t5_tiny", num_encoder_layers=1, num_decoder_layers=1)
    student = objective.build_model(student_cfg)
    picked = objective.initial_params(str(tmp_path / "teacher"), predict.abstract_params(student_cfg, module=student))
    full = checkpoint_reader.restore_params(str(tmp_path / "teacher"), predict.abstract_params(teacher_cfg))
    jax.tree.map(np.testing.assert_array_equal, picked["encoder"]["layers_0"], full["encoder"]["layers_1"])
    jax.tree.map(np.testing.assert_array_equal, picked["decoder"]["layers_0"], full["decoder"]["layers_0"])
    wider = models.get_config("t5_tiny", num_encoder_layers=1, num_decoder_layers=1, d_ff=64)
    with pytest.raises(ConfigError, match="only its depth"):
        objective.initial_params(str(tmp_path / "teacher"), predict.abstract_params(wider))
    assert os.path.exists(tmp_path / "teacher" / "model_config.json")


def test_sequence_level_distillation_task_trains_on_the_teachers_beam_outputs(tmp_path):
    from conftest import shared_data_dir
    from t5lite.data import vocab
    from t5lite.objectives import sequence_distillation
    data_dir = os.path.join(shared_data_dir(), "summarization", "cnn_dailymail")
    teacher_cfg = models.get_config("t5_tiny", dropout_rate=0.0)
    train_tiny(tmp_path / "teacher", teacher_cfg, 1)
    out = str(tmp_path / "teacher_targets")
    decode = dict(num_beams=2, max_input_length=32, max_decode_length=6, batch_size=4)
    path = sequence_distillation.write_teacher_targets(str(tmp_path / "teacher"), "cnn_dailymail", "validation", out,
                                                       data_dir=data_dir, max_examples=3, **decode)
    written = [json.loads(line) for line in open(path)]
    base = list(itertools.islice(get_task("cnn_dailymail").get_dataset("validation", data_dir=data_dir), 3))
    assert [r["inputs"] for r in written] == [ex["inputs_pretokenized"] for ex in base]
    beams = list(predict.infer([ex["inputs_pretokenized"] for ex in base], checkpoint_path=str(tmp_path / "teacher"),
                               method="beam", progress=False, **decode))
    assert [r["targets"] for r in written] == [b["prediction"] for b in beams]
    task = sequence_distillation.register_teacher_task("test_cnn_dailymail_teacher", "cnn_dailymail",
                                                       splits=("validation",))
    try:
        examples = list(task.get_dataset("validation", data_dir=out))
    finally:
        TaskRegistry.remove("test_cnn_dailymail_teacher")   # the docs' task list names the built-in tasks only
    eos = vocab.DEFAULT_VOCABULARY.eos_id
    for ex, r in zip(examples, written):
        assert list(ex["targets"]) == list(vocab.DEFAULT_VOCABULARY.encode(r["targets"])) + [eos]
        assert ex["inputs_pretokenized"] == r["inputs"]


@pytest.mark.parametrize("files,expected", [
    (["configs/local/minilm_distill_sst2.gin"],
     dict(temperature=2.0, alphas=dict(ce=0.5, hard=0.5, mse=0.0, cos=0.0, hidden=0.0, attention=0.0),
          student_layers=[0, 2, 4], positions="inputs")),
    (["configs/local/bert_tiny_pretrain.gin", "gin/objectives/distilbert.gin"],
     dict(temperature=2.0, alphas=dict(ce=5.0, hard=2.0, mse=0.0, cos=1.0, hidden=0.0, attention=0.0),
          student_layers=[0, 2, 4, 7, 9, 11], positions="inputs")),
])
def test_distillation_gin_presets_are_distilberts(files, expected):
    import gin
    from conftest import REPO
    from t5lite import cli
    from t5lite.train import trainer
    from t5lite.objectives.finetune import ClassificationObjective
    gin.clear_config()
    try:
        finetune = "sst2" in files[0]
        bindings = ["MODEL_DIR = '/tmp/x'", "TEACHER_PATH = '/tmp/teacher'"] + (
            ["INITIAL_CHECKPOINT_PATH = '/tmp/base'", "DATA_DIR = 'data'"] if finetune else [])
        cli.parse_gin([str(REPO / f) for f in files], bindings, entry=("train", trainer.train))
        objective = gin.query_parameter("train.objective").scoped_configurable_fn()
        assert isinstance(objective, DistillationObjective) and objective.teacher_path == "/tmp/teacher"
        assert {k: getattr(objective, k) for k in expected if k != "student_layers"} == {
            k: v for k, v in expected.items() if k != "student_layers"}
        assert list(objective.student_layers) == expected["student_layers"]
        wrapped = ClassificationObjective if finetune else MlmObjective
        assert isinstance(objective.objective, wrapped)
    finally:
        gin.clear_config()


def _kd_numpy(s, t, weights, T):
    p_t = np.exp(_np_log_softmax(t / T))
    per = np.sum(p_t * (np.log(p_t) - _np_log_softmax(s / T)), -1) * T ** 2
    return float(np.sum(per * weights) / max(np.sum(weights), 1.0))


@pytest.mark.parametrize("family", ["gpt2_tiny", "t5_tiny", "bert_tiny_classifier"])
def test_soft_targets_of_every_family_equal_numpy(family):
    """LM (decoder-only), text-to-text (encoder-decoder) and a GLUE head: the KD term over the
    distilled positions equals the formula on each model's own logits."""
    from t5lite.objectives.finetune import ClassificationObjective
    from t5lite.objectives.base import Objective
    rng = np.random.default_rng(4)
    if family == "bert_tiny_classifier":
        wrapped, teacher_cfg, student_cfg = ClassificationObjective(num_labels=3), _tiny_bert(2), _tiny_bert(1)
        tokens = rng.integers(5, 1000, size=(4, 10)).astype(np.int32)
        tokens[1, 7:] = 0
        batch = {"encoder_input_tokens": tokens, "token_type_ids": np.zeros_like(tokens),
                 "label": rng.integers(0, 3, size=(4,)).astype(np.int32)}
    else:
        wrapped = Objective()
        teacher_cfg = models.get_config(family, dropout_rate=0.0)
        student_cfg = teacher_cfg.replace(**{k: 1 for k in ("num_encoder_layers", "num_decoder_layers")
                                             if getattr(teacher_cfg, k)})
        targets = rng.integers(5, 900, size=(3, 8)).astype(np.int32)
        targets[0, 6:] = 0
        batch = {"decoder_target_tokens": targets, "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
                 "decoder_loss_weights": (targets > 0).astype(np.int32)}
        if family == "t5_tiny":
            batch["encoder_input_tokens"] = rng.integers(5, 900, size=(3, 12)).astype(np.int32)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    loss_cfg = LossConfig(z_loss=0.0)
    teacher_module, student_module = wrapped.build_model(teacher_cfg), wrapped.build_model(student_cfg)
    init = wrapped.init_features({k: v.shape[1] for k, v in batch.items() if v.ndim == 2})
    t_params = teacher_module.init(jax.random.key(0), **init)["params"]
    s_params = student_module.init(jax.random.key(1), **init)["params"]
    objective = DistillationObjective(wrapped, teacher_path="unused", temperature=3.0, alpha_ce=1.0, alpha_hard=0.0,
                                      positions="targets")
    objective.teacher_config, objective.teacher_module = teacher_cfg, teacher_module
    normalizers = objective.normalizers(batch, loss_cfg)
    ours, _ = objective.loss_and_metrics(student_module, s_params, batch, jax.random.key(2), normalizers, loss_cfg,
                                         frozen=t_params)
    if family == "bert_tiny_classifier":
        logits = [wrapped.apply(m, p, {**batch}, None) for m, p in ((student_module, s_params),
                                                                    (teacher_module, t_params))]
        weights = np.ones(4)
    else:
        features = {k: v for k, v in batch.items() if k.endswith("input_tokens")}
        logits = [m.apply({"params": p}, **features) for m, p in ((student_module, s_params),
                                                                  (teacher_module, t_params))]
        weights = np.asarray(batch["decoder_loss_weights"])
    s, t = (np.asarray(x, np.float64) for x in logits)
    # KL of two close distributions is a difference of nearly equal float32 log-probabilities: each
    # carries ~1e-7 of absolute rounding, which near-zero KLs (fresh heads) see as a large ratio.
    np.testing.assert_allclose(float(ours), _kd_numpy(s, t, weights, 3.0), rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize("teacher_preset, differ", [
    ("t5_tiny", "vocab_size 1000 vs 2176"),   # t5_tiny with another vocabulary: NaN losses once ran
    ("bert_tiny", "arch 'encoder' vs 'encoder_decoder'"),   # features the teacher lacks: a traceback once
])
def test_a_teacher_of_another_family_or_vocabulary_is_refused_before_training(tmp_path, teacher_preset, differ):
    from t5lite.models.config import save_config
    from t5lite.run_layout import RunDir
    from t5lite.train.checkpoints import Checkpointer
    teacher = tmp_path / "teacher"
    ckpt = Checkpointer(str(RunDir(str(teacher)).checkpoints), save_every=1, async_save=False)
    ckpt.save(0, {"params": {"w": np.zeros(1, np.float32)}}, {}, force=True)   # refused before it is read
    ckpt.close()
    teacher_cfg = models.get_config(teacher_preset, **({"vocab_size": 1000} if teacher_preset == "t5_tiny" else {}))
    save_config(teacher_cfg, RunDir(str(teacher)).model_config)
    student_cfg = models.get_config("t5_tiny", num_encoder_layers=1, num_decoder_layers=1)
    with pytest.raises(ConfigError) as refused:
        train_tiny(tmp_path / "student", student_cfg, 1, objective=DistillationObjective(teacher_path=str(teacher)))
    from t5lite.cli import user_message
    message = user_message(refused.value)   # what the CLI prints
    assert f"the distillation teacher {teacher} does not fit the student model_config ({differ}" in message, message
    assert "need the same arch and vocabulary" in message and len(message.splitlines()) == 1
    assert not (tmp_path / "student" / "metrics.jsonl").exists()   # no step was taken
