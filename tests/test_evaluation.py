"""Task evaluation: free decoding and rank classification agree with brute-force computations,
targets go through the task's postprocessor, and padding rows never reach the metrics."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import metrics, models
from t5lite.data import FunctionSource, TaskRegistry
from t5lite.data import preprocessors as P
from t5lite.data.registry import map_over_dataset
from t5lite.data.tasks.pretraining import FEATURES
from t5lite.data.vocab import DEFAULT_VOCABULARY, EOS_ID
from t5lite.infer import decoding, evaluation, predict, scoring
from t5lite.train import checkpoints

LENGTHS = {"inputs": 16, "targets": 4}
WORDS = ["module", "function", "class", "value", "list", "string", "file", "error"]


def _examples(split):
    rng = np.random.default_rng(0 if split == "train" else 1)
    return [{"sentence": " ".join(rng.choice(WORDS, 4)), "label": int(rng.integers(2))} for _ in range(11)]


def _format(ex):
    return {"inputs": f"guess sentence: {ex['sentence']}", "targets": ("no", "yes")[ex["label"]],
            "label": ex["label"]}


def _label_or_minus_one(text, example=None, is_target=False):
    """Targets become the example's label, predictions the index of their text (-1 if neither)."""
    if is_target:
        return example["label"]
    return {"no": 0, "yes": 1}.get(text, -1)


@pytest.fixture(scope="module")
def task():
    TaskRegistry.remove("eval_test_guess")
    task = TaskRegistry.add("eval_test_guess", FunctionSource(_examples),
                            [map_over_dataset(_format), P.tokenize, P.append_eos_after_trim],
                            FEATURES, metric_fns=[metrics.accuracy], postprocess_fn=_label_or_minus_one)
    yield task
    TaskRegistry.remove("eval_test_guess")


@pytest.fixture(scope="module")
def model():
    module = models.build(models.get_config("t5_tiny", d_model=32, num_heads=2, head_dim=16, d_ff=64,
                                            num_encoder_layers=1, num_decoder_layers=1, vocab_size=2176))
    params = nn.unbox(jax.jit(module.init)(jax.random.key(0), encoder_input_tokens=jnp.ones((1, 8), jnp.int32),
                                           decoder_input_tokens=jnp.ones((1, 4), jnp.int32)))["params"]
    return module, params


def test_label_strings_come_from_the_task_or_its_targets(task):
    examples = list(task.get_dataset("validation", LENGTHS))
    assert evaluation.label_strings(task, examples) == ["no", "yes"]
    free_text = [{"targets_pretokenized": f"answer {i}"} for i in range(50)]
    assert evaluation.label_strings(task, free_text) is None
    named = type("Named", (), {"label_names": ("b", "a", "c")})()
    assert evaluation.label_strings(named, examples) == ["b", "a", "c"]


def test_evaluator_matches_brute_force_decoding_and_scoring(task, model):
    module, params = model
    evaluator = evaluation.Evaluator(task, "validation", LENGTHS, batch_size=4)   # 11 examples: 3 batches
    result = evaluator.evaluate(module, params)
    examples = evaluator.examples
    assert len(result.predictions) == len(examples) == 11
    assert set(result.metrics) == {"loss", "accuracy", "score_accuracy"}

    inputs = np.zeros((12, LENGTHS["inputs"]), np.int32)      # 11 examples and a padding row
    targets = np.zeros((12, LENGTHS["targets"]), np.int32)
    for i, ex in enumerate(examples):
        inputs[i, :len(ex["inputs"])] = ex["inputs"]
        targets[i, :len(ex["targets"])] = ex["targets"]
    # In batches of 4, the shapes the evaluator compiled for.
    in_fours = lambda fn, *arrays: np.concatenate([np.asarray(fn(*(jnp.asarray(a[i:i + 4]) for a in arrays)))
                                                   for i in range(0, 12, 4)])[:11]
    decoded = in_fours(lambda x: decoding.greedy(module, params, {"encoder_input_tokens": x},
                                                 max_decode_length=LENGTHS["targets"]).tokens, inputs)
    texts = [predict.detokenize(DEFAULT_VOCABULARY, ids) for ids in decoded]
    assert [r["prediction"] for r in result.predictions] == texts

    labels = ["no", "yes"]
    log_likelihood = lambda x, y: scoring.target_log_likelihood(module, params, {"encoder_input_tokens": x}, y)
    per_label = []
    for label in labels:     # each label scored as a full target (no shared encoder)
        ids = DEFAULT_VOCABULARY.encode(label) + [EOS_ID]
        candidate = np.zeros_like(targets)
        candidate[:, :len(ids)] = ids
        per_label.append(in_fours(log_likelihood, inputs, candidate))
    chosen = [labels[i] for i in np.argmax(np.stack(per_label, axis=1), axis=1)]
    assert [r["score_prediction"] for r in result.predictions] == chosen
    gold = [ex["label"] for ex in examples]
    expected = 100.0 * np.mean([{"no": 0, "yes": 1}[c] == g for c, g in zip(chosen, gold)])
    assert result.metrics["score_accuracy"] == pytest.approx(expected)
    expected_free = 100.0 * np.mean([_label_or_minus_one(t) == g for t, g in zip(texts, gold)])
    assert result.metrics["accuracy"] == pytest.approx(expected_free)

    loss = -in_fours(log_likelihood, inputs, targets)
    assert result.metrics["loss"] == pytest.approx(loss.sum() / (targets != 0).sum(), rel=1e-5)


def test_log_likelihood_is_the_teacher_forced_cross_entropy(task, model):
    module, params = model
    # The evaluator's shapes (batch 4, inputs 16, targets 4), so the scoring functions are compiled already.
    inputs = jnp.asarray(np.random.default_rng(3).integers(3, 2000, (4, 16)), jnp.int32)
    targets = np.array([[5, 9, 1, 0], [7, 1, 0, 0], [8, 1, 0, 0], [4, 4, 4, 1]], np.int32)
    decoder_inputs = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]
    logits = jax.jit(module.apply)({"params": params}, encoder_input_tokens=inputs,
                                   decoder_input_tokens=jnp.asarray(decoder_inputs))
    logp = np.asarray(jax.nn.log_softmax(logits))
    expected = [sum(logp[b, t, targets[b, t]] for t in range(4) if targets[b, t]) for b in range(4)]
    inputs = {"encoder_input_tokens": inputs}
    got = scoring.target_log_likelihood(module, params, inputs, jnp.asarray(targets))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)
    candidates = targets[1:3, :2]              # "7 EOS" and "8 EOS", scored against every input
    ranked = np.asarray(scoring.rank_candidates(module, params, inputs, jnp.asarray(candidates)))
    for c, candidate in enumerate(candidates):
        as_targets = np.zeros_like(targets)
        as_targets[:, :2] = candidate
        np.testing.assert_allclose(ranked[:, c], np.asarray(scoring.target_log_likelihood(
            module, params, inputs, jnp.asarray(as_targets))), rtol=1e-5)


def test_ids_past_the_vocabulary_decode_as_unknown():
    size = DEFAULT_VOCABULARY.vocab_size
    assert predict.detokenize(DEFAULT_VOCABULARY, [size + 5, EOS_ID, 0]) == DEFAULT_VOCABULARY.decode([2])


def test_eval_and_infer_entry_points_read_a_checkpoint(task, model, tmp_path):
    module, params = model
    ckpt = checkpoints.Checkpointer(str(tmp_path / "run" / "checkpoints"), 1, async_save=False)
    ckpt.save(5, {"params": params}, {}, force=True)
    ckpt.close()
    direct = evaluation.Evaluator(task, "validation", LENGTHS, batch_size=4).evaluate(module, params)
    scores = evaluation.evaluate(checkpoint_path=str(tmp_path / "run"), mixture_or_task_name=task.name,
                                 task_feature_lengths=LENGTHS, model=module.config, batch_size=4)
    assert scores == pytest.approx(direct.metrics)
    folder = tmp_path / "run" / "eval" / f"{task.name}.validation"
    written = [json.loads(line) for line in open(folder / "predictions.jsonl")]
    assert written == direct.predictions
    record = json.loads(open(folder / "metrics.jsonl").readline())
    assert record["step"] == 5 and record["examples"] == 11 and record["accuracy"] == pytest.approx(scores["accuracy"])

    texts = [p["inputs"] for p in direct.predictions[:4]]
    out = predict.infer(texts, checkpoint_path=str(tmp_path / "run"), model=module.config,
                        max_decode_length=LENGTHS["targets"], max_input_length=LENGTHS["inputs"], progress=False)
    assert [r["prediction"] for r in out] == [p["prediction"] for p in direct.predictions[:4]]


def test_a_gin_model_that_differs_from_the_run_in_what_the_weights_compute_is_refused(task, model, tmp_path):
    """A run trained with an override (here a layer norm's epsilon) that the eval command leaves out
    would be read by another model than the one that learned the weights: refused in one line naming
    the field and the flag that restores it. Dropout and rematerialisation may differ."""
    from t5lite.errors import ConfigError
    from t5lite.models.config import save_config
    from t5lite.run_layout import RunDir
    module, params = model
    trained = module.config.replace(layer_norm_epsilon=1e-5)
    ckpt = checkpoints.Checkpointer(str(tmp_path / "run" / "checkpoints"), 1, async_save=False)
    ckpt.save(5, {"params": params}, {}, force=True)
    ckpt.close()
    save_config(trained, str(RunDir(tmp_path / "run").model_config))
    args = dict(checkpoint_path=str(tmp_path / "run"), mixture_or_task_name=task.name, task_feature_lengths=LENGTHS,
                batch_size=4)
    given = module.config
    assert given.layer_norm_epsilon != trained.layer_norm_epsilon
    with pytest.raises(ConfigError, match=r"trained with model_config layer_norm_epsilon=1e-05, and the gin model has "
                                          r"1e-06: .*--gin.model_config.overrides=\"\{'layer_norm_epsilon': 1e-05\}\""):
        evaluation.evaluate(model=given, **args)
    with pytest.raises(ConfigError, match=r"mlp_activations=\('relu',\).* \(and layer_norm_epsilon\)"):
        evaluation.evaluate(model=given.replace(mlp_activations=("gelu",)), **args)
    direct = evaluation.Evaluator(task, "validation", LENGTHS, batch_size=4).evaluate(models.build(trained), params)
    as_run = evaluation.evaluate(model=trained.replace(dropout_rate=0.3, mlp_dropout=False, remat_policy="full"), **args)
    assert as_run == pytest.approx(direct.metrics)
    assert evaluation.evaluate(model=None, **args) == pytest.approx(direct.metrics)   # the run's own model_config.json


def test_flat_metrics_adds_the_glue_average_with_t5_grouping():
    """The grouping itself is checked against t5's compute_avg_glue in test_reference_data.py."""
    scores = {"glue_cola": {"matthews_corrcoef": 40.0}, "glue_sst2": {"accuracy": 90.0},
              "glue_mrpc": {"f1": 80.0, "accuracy": 70.0}, "glue_stsb": {"pearson_corrcoef": 60.0,
                                                                           "spearman_corrcoef": 50.0},
              "glue_qqp": {"f1": 30.0, "accuracy": 20.0}, "glue_mnli_matched": {"accuracy": 10.0},
              "glue_mnli_mismatched": {"accuracy": 0.0}, "glue_qnli": {"accuracy": 100.0},
              "glue_rte": {"accuracy": 60.0}, "glue_wnli": {"accuracy": 0.0}}
    flat = evaluation.flat_metrics({t: evaluation.EvalResult(m, []) for t, m in scores.items()})
    assert flat["glue_cola/matthews_corrcoef"] == 40.0 and "super_glue_average" not in flat
    assert flat["glue_average"] == pytest.approx((40 + 90 + 75 + 55 + 25 + 5 + 100 + 60) / 8)


def test_a_pretraining_task_is_scored_beside_its_unigram_loss(model, task, monkeypatch):
    """Span corruption has no metric functions: its evaluation is the teacher-forced `loss` over the
    target tokens and, with the training split counted, `unigram_loss`: each held-out target token's
    -log of its add-one-half smoothed frequency among the targets of the first UNIGRAM_EXAMPLES
    training examples (counted here with collections.Counter and math.log). A task with metrics is
    scored by them and counts nothing."""
    import collections
    import itertools
    import math
    from t5lite.data import catalog
    from t5lite.infer import unigram
    module, params = model
    monkeypatch.setattr(unigram, "UNIGRAM_EXAMPLES", 300)
    pretraining = catalog.get_task_or_mixture("embedded_docs_span_corruption")
    lengths = {"inputs": 64, "targets": 16}
    evaluator = evaluation.Evaluator(pretraining, "validation", lengths, batch_size=8, max_examples=24)
    assert "unigram_loss" not in evaluator.evaluate(module, params).metrics   # nothing counted yet
    evaluator.count_training_tokens(pretraining, "train", lengths)
    result = evaluator.evaluate(module, params).metrics

    def targets(split, count):
        return [int(t) for ex in itertools.islice(pretraining.get_dataset(split, lengths), count) for t in ex["targets"]]

    counts, held_out = collections.Counter(targets("train", 300)), targets("validation", 24)
    total, vocab = sum(counts.values()), module.config.vocab_size
    expected = -sum(math.log((counts[t] + 0.5) / (total + 0.5 * vocab)) for t in held_out) / len(held_out)
    assert result["unigram_loss"] == pytest.approx(expected, rel=1e-9)
    assert 0 < result["loss"] and math.isfinite(result["loss"])
    with_metrics = evaluation.Evaluator(task, "validation", LENGTHS, batch_size=4)
    with_metrics.count_training_tokens(task, "train", LENGTHS)
    assert "unigram_loss" not in with_metrics.evaluate(module, params).metrics
