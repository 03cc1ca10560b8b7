"""Task evaluation for every family with a decoder, against PyTorch `transformers` on the same random
weights: rank classification picks HF's most likely label (BART pads with 1 and ends with 2;
GPT-2 scores the label as the continuation of the input) and the loss is HF's per-token NLL."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="HF comparisons need the optional torch dependency (extras 'hf')")
transformers = pytest.importorskip("transformers", reason="HF comparisons need transformers (extras 'hf')")

from t5lite import metrics  # noqa: E402
from t5lite.data import FunctionSource, TaskRegistry  # noqa: E402
from t5lite.data import preprocessors as P  # noqa: E402
from t5lite.data.registry import Feature, map_over_dataset  # noqa: E402
from t5lite.infer import evaluation  # noqa: E402
from t5lite.interop import hf  # noqa: E402

V = 60
WORDS = [f"w{i}" for i in range(40)]
LABELS = ["yes", "no", "maybe"]
LENGTHS = {"inputs": 12, "targets": 4}


class WordVocab:
    """One id per word, from 4 up; the model's own pad and EOS ids."""

    def __init__(self, pad_id, eos_id):
        self.pad_id, self.eos_id, self.unk_id = pad_id, eos_id, 3
        self.words = ["guess", *LABELS] + WORDS
        self.vocab_size = V

    def encode(self, text):
        return [4 + self.words.index(w) for w in text.split()]

    def decode(self, ids):
        return " ".join(self.words[i - 4] for i in ids if 4 <= i < 4 + len(self.words))


def _examples(split):
    rng = np.random.default_rng(7)
    return [{"sentence": " ".join(rng.choice(WORDS, int(rng.integers(2, 8)))), "label": int(rng.integers(3))}
            for _ in range(10)]


def _format(ex):
    return {"inputs": f"guess {ex['sentence']}", "targets": LABELS[ex["label"]], "label": ex["label"]}


def _hf_model(name):
    """A tiny random HF model with sharp logits, so the labels' likelihoods differ clearly."""
    torch.manual_seed(1)   # a seed under which every label wins somewhere
    if name == "bart":
        config = transformers.BartConfig(vocab_size=V, d_model=32, encoder_layers=1, decoder_layers=1,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                         decoder_ffn_dim=64, max_position_embeddings=32, init_std=0.5)
        return transformers.BartForConditionalGeneration(config).eval()
    config = transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=1, n_head=4, n_positions=32,
                                     initializer_range=0.5, bos_token_id=V - 1, eos_token_id=V - 1)
    return transformers.GPT2LMHeadModel(config).eval()


def _hf_log_likelihood(name, model, inputs, target):
    """HF's summed log-probability of `target` after `inputs` (one unpadded example)."""
    with torch.no_grad():
        if name == "bart":
            start = model.generation_config.decoder_start_token_id
            logits = model(input_ids=torch.tensor([inputs]),
                           decoder_input_ids=torch.tensor([[start] + target[:-1]])).logits[0]
        else:
            logits = model(input_ids=torch.tensor([inputs + target])).logits[0, len(inputs) - 1:-1]
    return float(logits.log_softmax(-1)[torch.arange(len(target)), torch.tensor(target)].sum())


@pytest.mark.parametrize("name", ["bart", "gpt2"])
def test_rank_classification_and_loss_are_hf_likelihoods(name, tmp_path):
    model = _hf_model(name)
    model.save_pretrained(tmp_path)
    module, variables = hf.load(str(tmp_path))
    cfg = module.config
    vocab = WordVocab(cfg.pad_token_id, cfg.eos_token_id)
    task_name = f"eval_hf_test_{name}"
    TaskRegistry.remove(task_name)
    task = TaskRegistry.add(task_name, FunctionSource(_examples),
                            [map_over_dataset(_format), P.tokenize, P.append_eos_after_trim],
                            {"inputs": Feature(vocab), "targets": Feature(vocab)}, metric_fns=[metrics.accuracy],
                            postprocess_fn=lambda text, example=None, is_target=False:
                            example["label"] if is_target else (LABELS.index(text) if text in LABELS else -1))
    try:
        evaluator = evaluation.Evaluator(task, "validation", LENGTHS, batch_size=4)   # 10 examples: 3 batches
        result = evaluator.evaluate(module, variables["params"])
    finally:
        TaskRegistry.remove(task_name)
    assert sorted(evaluator.labels) == sorted(LABELS)
    labels = [vocab.encode(label) + [vocab.eos_id] for label in evaluator.labels]
    expected, nll, tokens = [], 0.0, 0
    for ex in evaluator.examples:
        inputs = [int(i) for i in ex["inputs"]]
        scores = [_hf_log_likelihood(name, model, inputs, label) for label in labels]
        assert sorted(scores)[-1] - sorted(scores)[-2] > 1e-3, "labels should not tie"
        expected.append(evaluator.labels[int(np.argmax(scores))])
        nll -= _hf_log_likelihood(name, model, inputs, [int(i) for i in ex["targets"]])
        tokens += len(ex["targets"])
    assert [r["score_prediction"] for r in result.predictions] == expected
    assert len(set(expected)) > 1, "a test where one label always wins proves little"
    gold = [LABELS[ex["label"]] for ex in evaluator.examples]
    assert result.metrics["score_accuracy"] == pytest.approx(100 * np.mean(np.array(expected) == np.array(gold)))
    assert result.metrics["loss"] == pytest.approx(nll / tokens, rel=1e-4)
