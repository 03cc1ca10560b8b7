"""Encoder pre-training losses against independent references: HF PyTorch `BertForPreTraining` /
`AlbertForPreTraining` losses on the same weights, SpanBERT's SBO re-derived in numpy from the
paper's formula, and gradient accumulation over microbatches."""
import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.special

from t5lite import models
from t5lite.objectives.encoder import MlmNspObjective, MlmObjective, MlmSboObjective, MlmSopObjective
from t5lite.objectives.base import LossConfig
from t5lite.train.partitioning import Partitioner
from t5lite.train.step import TrainTask
from conftest import assert_close

V = 97
NO_Z = LossConfig(z_loss=0.0)


def _mlm_batch(seed, shape=(4, 12), pad_from=(12, 9, 7, 12), label_key=None):
    """Random tokens, ~30% of the real ones masked for the loss, token types, and a 0/1 pair label."""
    rng = np.random.RandomState(seed)
    targets = rng.randint(5, V, shape).astype(np.int32)
    for row, n in enumerate(pad_from):
        targets[row, n:] = 0
    weights = ((rng.rand(*shape) < 0.3) & (targets > 0)).astype(np.int32)
    weights[:, 1] = targets[:, 1] > 0   # at least one per row
    inputs = np.where(weights == 1, 4, targets).astype(np.int32)
    types = (np.arange(shape[1])[None] >= np.array(pad_from)[:, None] // 2).astype(np.int32)
    batch = dict(encoder_input_tokens=inputs, encoder_target_tokens=targets, encoder_loss_weights=weights,
                 token_type_ids=types * (targets > 0))
    if label_key:
        batch[label_key] = rng.randint(0, 2, (shape[0], 1)).astype(np.int32)
    return batch


def _our_loss(objective, module, variables, batch, loss=NO_Z):
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    normalizers = objective.normalizers(batch, loss)
    value, metrics = objective.loss_and_metrics(module, variables["params"], batch, jax.random.key(0), normalizers,
                                                loss)
    return float(value), metrics


def _hf_loss(model, batch, label_key, hf_label_arg):
    torch = pytest.importorskip("torch", reason="the reference is HF PyTorch (extras 'hf')")
    t = lambda a: torch.tensor(np.asarray(a, np.int64))
    labels = np.where(batch["encoder_loss_weights"] == 1, batch["encoder_target_tokens"], -100)
    with torch.no_grad():
        out = model(input_ids=t(batch["encoder_input_tokens"]), attention_mask=t(batch["encoder_input_tokens"] != 0),
                    token_type_ids=t(batch["token_type_ids"]), labels=t(labels),
                    **{hf_label_arg: t(batch[label_key][:, 0])})
    return float(out.loss)


ENCODER_SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.mark.parametrize("family, objective", [("bert", MlmNspObjective()), ("albert", MlmSopObjective())])
def test_mlm_plus_sentence_loss_equals_hugging_face(tmp_path, family, objective):
    """BERT's total pre-training loss (MLM mean over masked tokens + NSP mean over pairs) and ALBERT's
    (MLM + SOP) are Hugging Face's `*ForPreTraining(labels=..., <pair label>=...).loss`."""
    torch = pytest.importorskip("torch", reason="the reference is HF PyTorch (extras 'hf')")
    transformers = pytest.importorskip("transformers", reason="the reference is HF PyTorch (extras 'hf')")
    from t5lite.interop import hf
    torch.manual_seed(0)
    if family == "bert":
        model = transformers.BertForPreTraining(transformers.BertConfig(**ENCODER_SMALL)).eval()
        hf_arg = "next_sentence_label"
    else:
        model = transformers.AlbertForPreTraining(transformers.AlbertConfig(
            embedding_size=16, classifier_dropout_prob=0.0, **ENCODER_SMALL)).eval()
        hf_arg = "sentence_order_label"
    model.save_pretrained(str(tmp_path / "hf"))
    module, variables = hf.load(str(tmp_path / "hf"))
    assert module.config.dropout_rate == 0.0
    batch = _mlm_batch(0, label_key=objective.label)
    ours, metrics = _our_loss(objective, module, variables, batch)
    reference = _hf_loss(model, batch, objective.label, hf_arg)
    assert_close(ours, reference)
    parts = {k: float(v[0] / v[1]) if isinstance(v, tuple) else float(v) for k, v in metrics.items()}
    assert_close(parts["mlm_loss"] + parts[f"{objective.prefix}_loss"], reference)
    assert 0 <= parts[f"{objective.prefix}_accuracy"] <= 1 and 0 <= parts["mlm_accuracy"] <= 1


def test_mlm_objective_is_the_mean_over_masked_tokens():
    """RoBERTa's loss in numpy: -log softmax(logits)[target] averaged over the masked tokens of the batch."""
    module = models.build(models.get_config("roberta_tiny", vocab_size=V, pad_token_id=0, dropout_rate=0.0))
    variables = _random_variables(module)
    batch = {**_mlm_batch(1), "token_type_ids": np.zeros((4, 12), np.int32)}   # RoBERTa has one token type
    ours, metrics = _our_loss(MlmObjective(), module, variables, batch)
    logits = np.asarray(module.apply(variables, **{k: jnp.asarray(v) for k, v in batch.items()}), np.float64)
    log_probs = logits - scipy.special.logsumexp(logits, axis=-1, keepdims=True)
    picked = np.take_along_axis(log_probs, batch["encoder_target_tokens"][..., None], -1)[..., 0]
    w = batch["encoder_loss_weights"]
    expected = -(picked * w).sum() / w.sum()
    assert_close(ours, expected)
    hits = ((logits.argmax(-1) == batch["encoder_target_tokens"]) * w).sum() / w.sum()
    assert abs(float(metrics["mlm_accuracy"][0] / metrics["mlm_accuracy"][1]) - hits) < 1e-6


def _random_variables(module, seed=0, **features):
    tokens = jnp.ones((1, 6), jnp.int32)
    shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), encoder_input_tokens=tokens, **features))
    rng = np.random.RandomState(seed)
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.2, s.shape), s.dtype), shapes)


def _span_batch(seed):
    """Two rows with spans (s..e) masked; per-token boundaries s-1, e+1 and 1-based positions."""
    batch = _mlm_batch(seed, shape=(2, 14), pad_from=(14, 11))
    spans = [[(2, 4), (7, 7)], [(1, 3), (5, 8)]]
    weights, left, right, rel = (np.zeros((2, 14), np.int32) for _ in range(4))
    for row, row_spans in enumerate(spans):
        for s, e in row_spans:
            for i in range(s, e + 1):
                weights[row, i], left[row, i], right[row, i], rel[row, i] = 1, s - 1, e + 1, i - s + 1
    batch.update(encoder_loss_weights=weights, span_left_boundary=left, span_right_boundary=right,
                 span_relative_position=rel,
                 encoder_input_tokens=np.where(weights == 1, 4, batch["encoder_target_tokens"]).astype(np.int32))
    return batch


def _layer_norm(x, scale, bias, eps):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def test_span_boundary_loss_matches_the_papers_formula():
    """SpanBERT (Joshi et al. 2020, eq. 1-2): h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}],
    h1 = LayerNorm(GeLU(W1 h0)), y_i = LayerNorm(GeLU(W2 h1)), loss = -log softmax(E y_i)[x_i]
    averaged over the span tokens; the total adds the MLM mean."""
    cfg = models.get_config("bert_tiny", vocab_size=V, dropout_rate=0.0, span_boundary_head=True)
    module = models.build(cfg)
    batch = _span_batch(2)
    variables = _random_variables(module)
    ours, metrics = _our_loss(MlmSboObjective(), module, variables, batch)
    jbatch = {k: jnp.asarray(v) for k, v in batch.items()}
    hidden = np.asarray(module.apply(variables, **jbatch, method="encode"), np.float64)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), flax.core.meta.unbox(variables["params"]))
    head, embedding = p["span_boundary_head"], p["token_embedder"]["embedding"]
    gelu = lambda x: 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))
    losses, hits = [], []
    for b, i in zip(*np.nonzero(batch["encoder_loss_weights"])):
        h = np.concatenate([hidden[b, batch["span_left_boundary"][b, i]], hidden[b, batch["span_right_boundary"][b, i]],
                            head["position"]["embedding"][batch["span_relative_position"][b, i] - 1]])
        for k in range(2):
            dense, norm = head[f"dense_{k}"], head[f"norm_{k}"]
            h = _layer_norm(gelu(h @ dense["kernel"] + dense["bias"]), norm["scale"], norm["bias"], cfg.layer_norm_epsilon)
        logits = embedding @ h + head["bias"]     # SpanBERT's head has an output bias of its own
        losses.append(scipy.special.logsumexp(logits) - logits[batch["encoder_target_tokens"][b, i]])
        hits.append(logits.argmax() == batch["encoder_target_tokens"][b, i])
    sbo = float(metrics["sbo_loss"][0] / metrics["sbo_loss"][1])
    assert_close(sbo, np.mean(losses))
    assert abs(float(metrics["sbo_accuracy"][0] / metrics["sbo_accuracy"][1]) - np.mean(hits)) < 1e-6
    mlm = float(metrics["mlm_loss"][0] / metrics["mlm_loss"][1])
    assert_close(ours, mlm + np.mean(losses))


@pytest.mark.parametrize("objective, preset, label", [(MlmNspObjective(), "bert_tiny", "next_sentence_label"),
                                                      (MlmSboObjective(), "bert_tiny", None)])
def test_microbatches_give_the_same_update(objective, preset, label):
    """Accumulating 2 microbatches is one step on the whole batch (divisors counted on the whole
    batch): same metrics, same SGD update."""
    cfg = models.get_config(preset, vocab_size=V, dropout_rate=0.0, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                            num_encoder_layers=1, span_boundary_head=label is None)
    if label is None:   # four rows with different tokens
        batch = {k: np.concatenate([v, _span_batch(5)[k]]) for k, v in _span_batch(3).items()}
    else:
        batch = _mlm_batch(3, label_key=label)
    lengths = {k: v.shape[1] for k, v in batch.items()}
    results = []
    for m in (1, 2):
        schedule = optax.constant_schedule(1.0)
        whole_batch = LossConfig(z_loss=0.0, normalizing_scope="global_batch")
        task = TrainTask(cfg, optax.sgd(schedule), schedule, Partitioner(), lengths, whole_batch, num_microbatches=m,
                         objective=objective)
        state = task.init_state(0)
        before = jax.device_get(state.params)
        with task.mesh_context():
            new_state, metrics = jax.jit(task.train_step)(state, {k: jnp.asarray(v) for k, v in batch.items()})
        update = jax.tree.map(lambda a, b: np.asarray(b) - np.asarray(a), before, jax.device_get(new_state.params))
        results.append((update, jax.device_get(metrics)))
    (u1, m1), (u2, m2) = results
    for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
        np.testing.assert_allclose(a, b, atol=2e-6)   # updates of about the learning rate: near zero
    for key in m1:
        np.testing.assert_allclose(m1[key], m2[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_objectives_add_their_heads_and_refuse_other_models():
    assert MlmSboObjective().build_model(models.get_config("bert_tiny")).config.span_boundary_head
    nsp_model = MlmNspObjective().build_model(models.get_config("roberta_tiny"))
    assert nsp_model.config.pooler and nsp_model.config.sentence_head
    with pytest.raises(ValueError, match="encoder_head='discriminator'"):
        MlmObjective().build_model(models.get_config("electra_tiny"))
    with pytest.raises(ValueError, match="span_boundary_head"):
        models.get_config("t5_tiny", span_boundary_head=True)


def test_the_unigram_baseline_scores_the_held_out_masked_tokens_by_the_training_counts(monkeypatch):
    """With the training split counted, the evaluation logs `unigram_loss`: each held-out masked token's
    -log of its add-one-half (Krichevsky-Trofimov) frequency among the masked tokens of the first
    UNIGRAM_EXAMPLES training examples, averaged; counted here with collections.Counter and math.log."""
    import collections
    import math
    from t5lite.data import catalog, converter_registry
    from t5lite.objectives import heldout
    monkeypatch.setattr(heldout, "UNIGRAM_EXAMPLES", 300)
    task = catalog.get_task_or_mixture("embedded_docs_bert_nsp_mlm")
    lengths, objective, vocab = {"inputs": 32}, MlmNspObjective(), 2176
    module = objective.build_model(models.get_config("bert_tiny", vocab_size=vocab))
    ones = jnp.ones((1, 32), jnp.int32)
    params = module.init(jax.random.key(1), encoder_input_tokens=ones, token_type_ids=ones,
                         method="pretraining_logits")["params"]
    (evaluator,) = objective.evaluators(task, "validation", lengths, batch_size=8, max_examples=40).values()
    assert "unigram_loss" not in evaluator.evaluate(module, params).metrics   # nothing counted yet
    evaluator.count_training_tokens(task, "train", lengths)

    def masked(split, count):
        examples = list(task.get_dataset(split, lengths))[:count]
        rows = converter_registry.get_feature_converter("encoder_nsp").convert(examples, lengths)
        return [int(t) for r in rows for t, w in zip(r["encoder_target_tokens"], r["encoder_loss_weights"]) if w > 0]

    counts, held_out = collections.Counter(masked("train", 300)), masked("validation", 40)
    total = sum(counts.values())
    expected = -sum(math.log((counts[t] + 0.5) / (total + 0.5 * vocab)) for t in held_out) / len(held_out)
    assert_close(evaluator.evaluate(module, params).metrics["unigram_loss"], expected, rtol=1e-9)
    assert 0 < expected < math.log(vocab)   # the frequencies beat a uniform guess


def test_mlm_nsp_evaluation_is_the_split_mean_of_numpys_cross_entropy_without_dropout():
    """A pre-training run with `eval_every` evaluates its objective's own loss: MLM's cross entropy and
    accuracy over every masked token of the split and NSP's over every pair (a short last batch counts its
    real pairs only), the model without dropout; the reference is numpy's over each row's logits."""
    from t5lite.data import catalog, converter_registry
    task = catalog.get_task_or_mixture("embedded_docs_bert_nsp_mlm")
    lengths, objective = {"inputs": 32}, MlmNspObjective()
    config = models.get_config("bert_tiny", vocab_size=2176, dropout_rate=0.3)
    module = objective.build_model(config)
    ones = jnp.ones((1, 32), jnp.int32)
    params = module.init(jax.random.key(1), encoder_input_tokens=ones, token_type_ids=ones,
                         method="pretraining_logits")["params"]
    (evaluator,) = objective.evaluators(task, "validation", lengths, batch_size=2, max_examples=5).values()
    result = evaluator.evaluate(module, params)

    examples = list(task.get_dataset("validation", lengths))[:5]
    rows = list(converter_registry.get_feature_converter("encoder_nsp").convert(examples, lengths))
    forward = jax.jit(lambda tokens, types: module.apply({"params": params}, encoder_input_tokens=tokens,
                                                         token_type_ids=types, method="pretraining_logits"))
    mlm, pairs = [], []
    for row in rows:
        logits = forward(row["encoder_input_tokens"][None], row["token_type_ids"][None])
        log_p = scipy.special.log_softmax(np.asarray(logits["mlm"][0], np.float64), axis=-1)
        for position in np.flatnonzero(row["encoder_loss_weights"]):
            target = row["encoder_target_tokens"][position]
            mlm.append((-log_p[position, target], log_p[position].argmax() == target))
        log_q = scipy.special.log_softmax(np.asarray(logits["sentence"][0], np.float64))
        label = int(np.reshape(row["next_sentence_label"], -1)[0])
        pairs.append((-log_q[label], log_q.argmax() == label))
    assert len(rows) == 5 and mlm
    expected = {"mlm_loss": np.mean([l for l, _ in mlm]), "mlm_accuracy": np.mean([h for _, h in mlm]),
                "nsp_loss": np.mean([l for l, _ in pairs]), "nsp_accuracy": np.mean([h for _, h in pairs])}
    assert set(result.metrics) == set(expected)
    for name, value in expected.items():
        assert_close(result.metrics[name], value, rtol=1e-5)


def test_a_pretraining_mixture_is_evaluated_task_by_task_each_with_its_unigram_loss(tmp_path, clean_gin_state):
    """A mixture samples its tasks without end, so an evaluation during training scores each task's
    split once, under the task's name, with the unigram baseline of that task's own training text
    (mBERT's per-language held-out loss); before, the evaluation never ended."""
    import json
    from conftest import REPO
    from t5lite import cli
    from t5lite.data.registry import MixtureRegistry
    from t5lite.train import trainer
    tasks = ("embedded_docs_bert_mlm", "embedded_docs_bert_mlm_static")
    MixtureRegistry.remove("two_mlm_tasks")
    MixtureRegistry.add("two_mlm_tasks", [(t, 1.0) for t in tasks])
    try:
        cli.parse_gin([str(REPO / "configs/local/bert_tiny_pretrain.gin"), str(REPO / "gin/objectives/bert_mlm.gin")],
                      [f"MODEL_DIR = '{tmp_path}'", "MIXTURE_OR_TASK_NAME = 'two_mlm_tasks'", "TRAIN_STEPS = 2",
                       "BATCH_SIZE = 4", "train.eval_every = 2", "train.eval_max_examples = 16"],
                      entry=("train", trainer.train))
        trainer.train(progress=False)
    finally:
        MixtureRegistry.remove("two_mlm_tasks")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (evaluated,) = [r for r in records if any(k.startswith("eval_") for k in r)]
    for task in tasks:
        assert 0 < evaluated[f"eval_{task}/mlm_loss"] < 20 and 0 < evaluated[f"eval_{task}/unigram_loss"] < 20
    assert (tmp_path / "eval" / f"{tasks[1]}.validation").is_dir()


def test_eval_of_a_pretraining_run_reports_the_unigram_loss_training_logged(tmp_path, clean_gin_state):
    """`t5lite eval --gin.eval.unigram_split="'train'"` of an MLM run gives the held-out `unigram_loss`
    its training logged on the same validation examples (and the same `mlm_loss`); without it, none."""
    import json
    from conftest import REPO
    from t5lite import cli
    from t5lite.train import trainer
    config = [str(REPO / "configs/local/bert_tiny_pretrain.gin"), str(REPO / "gin/objectives/bert_mlm.gin")]
    cli.parse_gin(config, [f"MODEL_DIR = '{tmp_path}'", "TRAIN_STEPS = 2", "BATCH_SIZE = 4", "train.eval_every = 2",
                           "train.eval_max_examples = 16"], entry=("train", trainer.train))
    trainer.train(progress=False)
    gin.clear_config()
    trained = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (logged,) = [r for r in trained if "eval_unigram_loss" in r]
    flags = [*(f"--gin_file={f}" for f in config), f"--gin.MODEL_DIR='{tmp_path}'", "--gin.eval.max_examples=16"]
    cli.main(["eval", *flags, "--gin.eval.unigram_split='train'"])
    gin.clear_config()
    cli.main(["eval", *flags])
    scored = [json.loads(line) for line in
              (tmp_path / "eval" / "embedded_docs_bert_mlm.validation" / "metrics.jsonl").read_text().splitlines()]
    assert scored[0]["unigram_loss"] == pytest.approx(logged["eval_unigram_loss"], rel=1e-9)
    assert scored[0]["mlm_loss"] == pytest.approx(logged["eval_mlm_loss"], rel=1e-5)
    assert "unigram_loss" not in scored[1]
