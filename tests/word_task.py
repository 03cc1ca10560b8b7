"""A word-level vocabulary with a model's own pad / EOS ids, a classification task over it, and
tiny random Hugging Face models: evaluation tests compare t5lite with `transformers` on them."""
from __future__ import annotations

import contextlib

import numpy as np

from t5lite import metrics
from t5lite.data import FunctionSource, TaskRegistry
from t5lite.data import preprocessors as P
from t5lite.data.registry import Feature, map_over_dataset

V = 60
WORDS = [f"w{i}" for i in range(40)]
LABELS = ["yes", "no", "maybe"]


class WordVocab:
    """One id per word (split on whitespace), from 4 up; the model's own pad and EOS ids."""

    def __init__(self, pad_id, eos_id):
        self.pad_id, self.eos_id, self.unk_id = pad_id, eos_id, 3
        self.words = ["guess", "->", *LABELS] + WORDS
        self.vocab_size = V

    def encode(self, text):
        return [4 + self.words.index(w) for w in text.split()]

    def decode(self, ids):
        return " ".join(self.words[i - 4] for i in ids if 4 <= i < 4 + len(self.words))


def _examples(split):
    rng = np.random.default_rng({"train": 3, "validation": 7}[split])
    return [{"sentence": " ".join(rng.choice(WORDS, int(rng.integers(2, 8)))), "label": int(rng.integers(3))}
            for _ in range(10)]


def _format(ex):
    return {"inputs": f"guess {ex['sentence']}", "targets": LABELS[ex["label"]], "label": ex["label"]}


def _label_index(text, example=None, is_target=False):
    return example["label"] if is_target else (LABELS.index(text) if text in LABELS else -1)


@contextlib.contextmanager
def word_task(name: str, vocab: WordVocab):
    """A registered 3-label task (10 train and 10 validation examples) in `vocab`, removed after."""
    TaskRegistry.remove(name)
    task = TaskRegistry.add(name, FunctionSource(_examples), [map_over_dataset(_format), P.tokenize,
                                                              P.append_eos_after_trim],
                            {"inputs": Feature(vocab), "targets": Feature(vocab)}, metric_fns=[metrics.accuracy],
                            postprocess_fn=_label_index)
    try:
        yield task
    finally:
        TaskRegistry.remove(name)


def hf_model(torch, transformers, name):
    """A tiny random HF BART or GPT-2 with sharp logits (large init), so likelihoods differ clearly;
    under this seed every label wins for some example."""
    torch.manual_seed(1)
    if name == "bart":
        config = transformers.BartConfig(vocab_size=V, d_model=32, encoder_layers=1, decoder_layers=1,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                         decoder_ffn_dim=64, max_position_embeddings=32, init_std=0.5)
        return transformers.BartForConditionalGeneration(config).eval()
    config = transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=1, n_head=4, n_positions=64,
                                     initializer_range=0.5, bos_token_id=V - 1, eos_token_id=V - 1)
    return transformers.GPT2LMHeadModel(config).eval()


def hf_log_likelihood(torch, name, model, inputs, target):
    """HF's summed log-probability of `target` after `inputs` (one unpadded example): decoded from
    HF's own start token (BART), or as the continuation of `inputs` (GPT-2)."""
    with torch.no_grad():
        if name == "bart":
            start = model.generation_config.decoder_start_token_id
            logits = model(input_ids=torch.tensor([inputs]),
                           decoder_input_ids=torch.tensor([[start] + target[:-1]])).logits[0]
        else:
            logits = model(input_ids=torch.tensor([inputs + target])).logits[0, len(inputs) - 1:-1]
    return float(logits.log_softmax(-1)[torch.arange(len(target)), torch.tensor(target)].sum())
