"""`hf.load_classifier` of transformers' text classifiers: BERT's dense `classifier` on its pooler,
RoBERTa's `classifier.dense` + tanh + `out_proj` on the first token (RoBERTa, Longformer with
its global first token) and DeBERTa-v2's ContextPooler (`pooler.dense` + GELU) + `classifier`, which
t5lite reads as BERT's pooler (DeBERTa's with its activation) and classifier. The logits of the loaded
task-head model equal the Hugging Face model's on the same ids, padding included."""
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close
from t5lite.interop import hf
from t5lite.interop.hf import HFConversionError

transformers = pytest.importorskip("transformers", reason="the reference classifiers are transformers'")
torch = pytest.importorskip("torch", reason="transformers' classifiers run on torch")

SIZES = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             initializer_range=0.3, num_labels=3)


def _classifiers():
    return {
        "bert": (transformers.BertForSequenceClassification, transformers.BertConfig(**SIZES, max_position_embeddings=64)),
        "roberta": (transformers.RobertaForSequenceClassification,
                    transformers.RobertaConfig(**SIZES, max_position_embeddings=66, type_vocab_size=1)),
        "longformer": (transformers.LongformerForSequenceClassification,
                       transformers.LongformerConfig(**SIZES, max_position_embeddings=66, type_vocab_size=1,
                                                     attention_window=[4, 8])),
        "deberta-v2": (transformers.DebertaV2ForSequenceClassification,
                       transformers.DebertaV2Config(**SIZES, max_position_embeddings=64, type_vocab_size=0,
                                                    relative_attention=True, position_biased_input=False,
                                                    share_att_key=True, pos_att_type=["p2c", "c2p"],
                                                    norm_rel_ebd="layer_norm", position_buckets=4,
                                                    max_relative_positions=16)),
    }


def _ids(pad_token_id):
    ids = np.random.default_rng(0).integers(3, 97, size=(2, 21))
    ids[1, 15:] = pad_token_id
    return ids


@pytest.mark.parametrize("name", ["bert", "roberta", "longformer", "deberta-v2"])
def test_loaded_classifier_logits_equal_transformers(tmp_path, name):
    cls, config = _classifiers()[name]
    torch.manual_seed(0)
    reference = cls(config).eval()
    reference.save_pretrained(tmp_path)
    ids = _ids(config.pad_token_id)
    mask = ids != config.pad_token_id
    with torch.no_grad():   # Longformer's classifier makes the first token global itself
        want = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    model, variables = hf.load_classifier(str(tmp_path))
    features = {"encoder_input_tokens": jnp.asarray(ids)}
    if name == "longformer":
        features["encoder_global_attention_mask"] = jnp.asarray(np.eye(1, ids.shape[1], dtype=np.int32).repeat(2, 0))
    got = model.apply(variables, **features)
    assert got.shape == (2, 3)
    assert_close(got, want, rtol=1e-4)
    if name == "deberta-v2":   # its ContextPooler's GELU, not BERT's tanh
        assert model.config.pooler_activation == "gelu_exact"


def test_a_folder_without_a_classifier_is_refused_naming_it(tmp_path):
    transformers.RobertaModel(transformers.RobertaConfig(**SIZES, max_position_embeddings=66)).save_pretrained(tmp_path)
    with pytest.raises(HFConversionError, match=r"neither a 'classifier' dense nor RoBERTa's 'classifier.dense'"):
        hf.load_classifier(str(tmp_path))


def test_electras_head_of_the_same_names_with_a_gelu_is_refused(tmp_path):
    """ElectraForSequenceClassification's head has RoBERTa's tensor names but a GELU, not a tanh."""
    config = transformers.ElectraConfig(**SIZES, embedding_size=32, max_position_embeddings=64)
    transformers.ElectraForSequenceClassification(config).save_pretrained(tmp_path)
    with pytest.raises(HFConversionError, match=r"this electra classifier's head .* is not RoBERTa's dense \+ tanh"):
        hf.load_classifier(str(tmp_path))


def test_a_deberta_pooler_narrower_than_the_model_is_refused_naming_both_widths(tmp_path):
    config = transformers.DebertaV2Config(**SIZES, max_position_embeddings=64, type_vocab_size=0, relative_attention=True,
                                          position_biased_input=False, share_att_key=True, pos_att_type=["p2c", "c2p"],
                                          norm_rel_ebd="layer_norm", position_buckets=4, pooler_hidden_size=16)
    transformers.DebertaV2ForSequenceClassification(config).save_pretrained(tmp_path)
    with pytest.raises(HFConversionError, match=r"pooler_hidden_size=16 differs from hidden_size=32"):
        hf.load_classifier(str(tmp_path))


def test_a_bert_with_a_gelu_pooler_is_not_exported_as_bert(tmp_path):
    """transformers' BertPooler has a tanh: a GELU pooler written as BERT would change the model."""
    config = transformers.BertConfig(**SIZES, max_position_embeddings=64)
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path)
    model, _ = hf.load_classifier(str(tmp_path))
    hf.export_config(model.config)
    with pytest.raises(HFConversionError, match="pooler_activation"):
        hf.export_config(model.config.replace(pooler_activation="gelu_exact"))
