"""Task evaluation for every family with a decoder, against PyTorch `transformers` on the same random
weights: rank classification picks HF's most likely label (BART pads with 1 and ends with 2;
GPT-2 scores the label as the continuation of the input) and the loss is HF's per-token NLL."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="HF comparisons need the optional torch dependency (extras 'hf')")
transformers = pytest.importorskip("transformers", reason="HF comparisons need transformers (extras 'hf')")

from t5lite.infer import evaluation  # noqa: E402
from t5lite.interop import hf  # noqa: E402
from word_task import LABELS, WordVocab, hf_log_likelihood, hf_model, word_task  # noqa: E402

LENGTHS = {"inputs": 12, "targets": 4}


@pytest.mark.parametrize("name", ["bart", "gpt2"])
def test_rank_classification_and_loss_are_hf_likelihoods(name, tmp_path):
    model = hf_model(torch, transformers, name)
    model.save_pretrained(tmp_path)
    module, variables = hf.load(str(tmp_path))
    vocab = WordVocab(module.config.pad_token_id, module.config.eos_token_id)
    with word_task(f"eval_hf_test_{name}", vocab) as task:
        evaluator = evaluation.Evaluator(task, "validation", LENGTHS, batch_size=4)   # 10 examples: 3 batches
        result = evaluator.evaluate(module, variables["params"])
    assert sorted(evaluator.labels) == sorted(LABELS)
    labels = [vocab.encode(label) + [vocab.eos_id] for label in evaluator.labels]
    expected, nll, tokens = [], 0.0, 0
    for ex in evaluator.examples:
        inputs = [int(i) for i in ex["inputs"]]
        scores = [hf_log_likelihood(torch, name, model, inputs, label) for label in labels]
        assert sorted(scores)[-1] - sorted(scores)[-2] > 1e-3, "labels should not tie"
        expected.append(evaluator.labels[int(np.argmax(scores))])
        nll -= hf_log_likelihood(torch, name, model, inputs, [int(i) for i in ex["targets"]])
        tokens += len(ex["targets"])
    assert [r["score_prediction"] for r in result.predictions] == expected
    assert len(set(expected)) > 1, "a test where one label always wins proves little"
    gold = [LABELS[ex["label"]] for ex in evaluator.examples]
    assert result.metrics["score_accuracy"] == pytest.approx(100 * np.mean(np.array(expected) == np.array(gold)))
    assert result.metrics["loss"] == pytest.approx(nll / tokens, rel=1e-4)
