"""Hugging Face interop: small random PyTorch models from transformers, saved, loaded into t5lite,
same logits (to 5e-5 of the logits' magnitude, float32, padded batches); t5lite -> HF -> t5lite is exact;
broken folders fail with messages that name the tensor."""
import functools
import json
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="parity tests need the optional torch dependency (extras 'hf')")
transformers = pytest.importorskip("transformers", reason="parity tests need transformers (extras 'hf')")

from conftest import assert_close  # noqa: E402
from t5lite import models  # noqa: E402
from t5lite.interop import hf  # noqa: E402

RTOL = 5e-5
V = 97


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _tokens(shape, low, seed, pad=None, lengths=None):
    ids = np.random.RandomState(seed).randint(low, V, shape)
    if lengths is not None:
        for row, n in enumerate(lengths):
            ids[row, n:] = pad
    return ids


def _save(model, tmp_path, name="hf"):
    out = str(tmp_path / name)
    model.save_pretrained(out)
    return out


def _torch(a):
    return torch.tensor(np.asarray(a))


def _ours(module, variables, method="__call__", **features):
    apply = jax.jit(functools.partial(module.apply, method=method))
    return np.asarray(apply(variables, **{k: jnp.asarray(v) for k, v in features.items()}))


def _random_variables(module, seed=0):
    """Like module.init, without compiling a random kernel per parameter shape (slow on CPU)."""
    tokens = jnp.zeros((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), encoder_input_tokens=tokens,
                                                decoder_input_tokens=tokens))
    rng = np.random.RandomState(seed)
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.2, s.shape), s.dtype), shapes)


def _assert_close(ours, ref, mask=None):
    """t5lite and torch agree to a tolerance relative to the magnitudes compared (AVX2 and AVX-512
    kernels round differently), on the unmasked positions."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    if mask is not None:
        ours, ref = ours[mask], ref[mask]
    assert_close(ours, ref, rtol=RTOL)


def _assert_exact_roundtrip(module, variables, tmp_path):
    out = hf.save(module, variables, str(tmp_path / "roundtrip"))
    module2, variables2 = hf.load(out, scan_layers=module.config.scan_layers)
    assert module2.config.replace(init_std=module.config.init_std, dropout_rate=module.config.dropout_rate) \
        == module.config
    a = flax.traverse_util.flatten_dict(flax.core.meta.unbox(variables["params"]))
    b = flax.traverse_util.flatten_dict(variables2["params"])
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg="/".join(k))


# ----------------------------------------------------------------------------- T5

def _t5_inputs():
    enc = _tokens((2, 12), 2, 0, pad=0, lengths=(12, 7))
    dec = _tokens((2, 9), 2, 1)
    dec[:, 0] = 0
    return enc, dec


def _t5_parity(model, tmp_path):
    module, variables = hf.load(_save(model.eval(), tmp_path))
    enc, dec = _t5_inputs()
    with torch.no_grad():
        ref = model(input_ids=_torch(enc), attention_mask=_torch(enc != 0), decoder_input_ids=_torch(dec)).logits
    _assert_close(_ours(module, variables, encoder_input_tokens=enc, decoder_input_tokens=dec), ref.numpy())
    with torch.no_grad():
        ref_enc = model.encoder(input_ids=_torch(enc), attention_mask=_torch(enc != 0)).last_hidden_state.numpy()
    ours_enc = _ours(module, variables, method="encode", encoder_input_tokens=enc)
    _assert_close(ours_enc, ref_enc, enc != 0)
    return module, variables


T5_SMALL = dict(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=20)


def test_t5_v1_0_parity_and_roundtrip(tmp_path):
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**T5_SMALL))
    module, variables = _t5_parity(model, tmp_path)
    assert module.config.tie_embeddings and module.config.scale_tied_logits
    assert module.config.mlp_activations == ("relu",)
    _assert_exact_roundtrip(module, variables, tmp_path)
    # Original v1.0 releases also store tied copies (lm_head, embed_tokens) with the same values.
    from safetensors.numpy import load_file, save_file
    path = str(tmp_path / "hf")
    weights = load_file(os.path.join(path, "model.safetensors"))
    for name in ("lm_head.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        weights[name] = weights["shared.weight"]
    save_file(weights, os.path.join(path, "model.safetensors"))
    module2, _ = hf.load(path)
    assert module2.config == module.config


def test_t5_v1_1_parity(tmp_path):
    # transformers 5.x always ties T5's lm_head (scale_decoder_outputs=False marks v1.1).
    config = transformers.T5Config(feed_forward_proj="gated-gelu", tie_word_embeddings=False, **T5_SMALL)
    module, _ = _t5_parity(transformers.T5ForConditionalGeneration(config), tmp_path)
    assert module.config.mlp_activations == ("gelu", "linear") and not module.config.scale_tied_logits


def test_mt5_parity(tmp_path):
    config = transformers.MT5Config(feed_forward_proj="gated-gelu", tie_word_embeddings=False, **T5_SMALL)
    _t5_parity(transformers.MT5ForConditionalGeneration(config), tmp_path)


def test_t5_untied_from_t5lite_loads_in_transformers(tmp_path):
    cfg = models.get_config("t5_1_1_tiny", vocab_size=V, d_model=32, head_dim=8, d_ff=64, num_heads=4)
    module = models.build(cfg)
    enc, dec = _t5_inputs()
    variables = _random_variables(module)
    out = hf.save(module, variables, str(tmp_path / "ours"))
    model, info = transformers.T5ForConditionalGeneration.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    with torch.no_grad():
        ref = model.eval()(input_ids=_torch(enc), attention_mask=_torch(enc != 0), decoder_input_ids=_torch(dec))
    _assert_close(_ours(module, variables, encoder_input_tokens=enc, decoder_input_tokens=dec), ref.logits.numpy())
    _assert_exact_roundtrip(module, variables, tmp_path)


def test_t5_scanned_load_matches_looped(tmp_path):
    config = transformers.T5Config(**{**T5_SMALL, "num_decoder_layers": 2})
    model = transformers.T5ForConditionalGeneration(config).eval()
    path = _save(model, tmp_path)
    looped, v_looped = hf.load(path)
    scanned, v_scanned = hf.load(path, scan_layers=True)
    assert "layers" in v_scanned["params"]["encoder"] and "layers_0" not in v_scanned["params"]["encoder"]
    enc, dec = _t5_inputs()
    assert_close(_ours(scanned, v_scanned, encoder_input_tokens=enc, decoder_input_tokens=dec),
                 _ours(looped, v_looped, encoder_input_tokens=enc, decoder_input_tokens=dec))
    _assert_exact_roundtrip(scanned, v_scanned, tmp_path)


# ----------------------------------------------------------------------------- BERT family

ENCODER_SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=40)


def _encoder_parity(model, tmp_path, pad=0, logits=lambda out: out.logits, token_types=True):
    module, variables = hf.load(_save(model.eval(), tmp_path))
    ids = _tokens((3, 11), 3, 2, pad=pad, lengths=(11, 6, 9))
    types = (np.arange(11)[None] >= np.array([[5], [3], [4]])).astype(np.int64) if token_types else None
    kwargs = dict(input_ids=_torch(ids), attention_mask=_torch(ids != pad))
    if types is not None:
        kwargs["token_type_ids"] = _torch(types)
    with torch.no_grad():
        ref = logits(model(**kwargs)).numpy()
    features = dict(encoder_input_tokens=ids) if types is None else dict(encoder_input_tokens=ids,
                                                                           token_type_ids=types)
    _assert_close(_ours(module, variables, **features), ref, ids != pad)
    return module, variables, features


def test_bert_parity_mlm_and_pooler(tmp_path):
    model = transformers.BertForPreTraining(transformers.BertConfig(**ENCODER_SMALL))
    module, variables, features = _encoder_parity(model, tmp_path, logits=lambda out: out.prediction_logits)
    assert module.config.encoder_head == "mlm" and module.config.pooler
    with torch.no_grad():
        pooled = model.bert(input_ids=_torch(features["encoder_input_tokens"]),
                            attention_mask=_torch(features["encoder_input_tokens"] != 0),
                            token_type_ids=_torch(features["token_type_ids"])).pooler_output.numpy()
    _assert_close(_ours(module, variables, method="pool", **features), pooled)
    _assert_sentence_head(model, module, variables, features, "seq_relationship_logits")
    _assert_exact_roundtrip(module, variables, tmp_path)


def _assert_sentence_head(model, module, variables, features, output):
    """NSP (BERT) / SOP (ALBERT) logits on the pooled first token."""
    tokens = features["encoder_input_tokens"]
    with torch.no_grad():
        ref = getattr(model(input_ids=_torch(tokens), attention_mask=_torch(tokens != 0),
                            token_type_ids=_torch(features["token_type_ids"])), output).numpy()
    _assert_close(_ours(module, variables, method="sentence_logits", **features), ref)


def test_bert_headless_model(tmp_path):
    model = transformers.BertModel(transformers.BertConfig(**ENCODER_SMALL))
    module, variables, _ = _encoder_parity(model, tmp_path, logits=lambda out: out.last_hidden_state)
    assert module.config.encoder_head == "none"
    out = hf.save(module, variables, str(tmp_path / "ours"))
    assert json.load(open(os.path.join(out, "config.json")))["architectures"] == ["BertModel"]
    _, info = transformers.BertModel.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info


def test_roberta_parity(tmp_path):
    config = transformers.RobertaConfig(**{**ENCODER_SMALL, "max_position_embeddings": 42}, type_vocab_size=1)
    model = transformers.RobertaForMaskedLM(config)
    module, variables, _ = _encoder_parity(model, tmp_path, pad=1, token_types=False)
    assert module.config.position_offset == 2 and module.config.pad_token_id == 1
    _assert_exact_roundtrip(module, variables, tmp_path)


def test_albert_parity(tmp_path):
    model = transformers.AlbertForPreTraining(transformers.AlbertConfig(embedding_size=16, **ENCODER_SMALL))
    module, variables, features = _encoder_parity(model, tmp_path, logits=lambda out: out.prediction_logits)
    assert module.config.share_layers and module.config.embedding_size == 16
    _assert_sentence_head(model, module, variables, features, "sop_logits")
    assert "layers" in variables["params"]["encoder"]   # one shared layer
    _assert_exact_roundtrip(module, variables, tmp_path)


def test_electra_discriminator_and_generator_parity(tmp_path):
    disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(embedding_size=16, **ENCODER_SMALL))
    module, variables, _ = _encoder_parity(disc, tmp_path / "d")
    assert module.config.encoder_head == "discriminator"
    _assert_exact_roundtrip(module, variables, tmp_path / "d")
    gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(embedding_size=16, **ENCODER_SMALL))
    module, variables, _ = _encoder_parity(gen, tmp_path / "g")
    assert module.config.encoder_head == "mlm"
    _assert_exact_roundtrip(module, variables, tmp_path / "g")


# ----------------------------------------------------------------------------- GPT-2 and BART

def test_gpt2_parity(tmp_path):
    config = transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=40, bos_token_id=0,
                                     eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    module, variables = hf.load(_save(model, tmp_path))
    ids = _tokens((2, 10), 1, 3, pad=0, lengths=(10, 6))
    mask = np.arange(10)[None] < np.array([[10], [6]])
    with torch.no_grad():
        ref = model(input_ids=_torch(ids), attention_mask=_torch(mask)).logits.numpy()
    _assert_close(_ours(module, variables, decoder_input_tokens=ids), ref, mask)
    _assert_exact_roundtrip(module, variables, tmp_path)


def test_bart_parity(tmp_path):
    config = transformers.BartConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=40)
    model = transformers.BartForConditionalGeneration(config).eval()
    with torch.no_grad():   # a non-zero final_logits_bias, so the test sees it
        model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
    module, variables = hf.load(_save(model, tmp_path))
    enc = _tokens((2, 12), 3, 4, pad=1, lengths=(12, 8))
    dec = _tokens((2, 7), 3, 5)
    dec[:, 0] = 2
    with torch.no_grad():
        ref = model(input_ids=_torch(enc), attention_mask=_torch(enc != 1), decoder_input_ids=_torch(dec)).logits
    _assert_close(_ours(module, variables, encoder_input_tokens=enc, decoder_input_tokens=dec), ref.numpy())
    _assert_exact_roundtrip(module, variables, tmp_path)


# ----------------------------------------------------------------------------- presets out and back in

def _slow(*args):   # bert_tiny, gpt2_tiny and t5_tiny are the fast siblings
    return pytest.param(*args, marks=pytest.mark.slow)


@pytest.mark.parametrize("name, hf_class", [
    ("bert_tiny", "BertForPreTraining"), ("gpt2_tiny", "GPT2LMHeadModel"), ("t5_tiny", "T5ForConditionalGeneration"),
    _slow("roberta_tiny", "RobertaForMaskedLM"), _slow("albert_tiny", "AlbertForPreTraining"),
    _slow("electra_tiny", "ElectraForPreTraining"), _slow("electra_tiny_generator", "ElectraForMaskedLM"),
    _slow("deberta_v3_tiny", "DebertaV2ForMaskedLM"), _slow("bart_tiny", "BartForConditionalGeneration")])
def test_tiny_presets_export_to_transformers(name, hf_class, tmp_path):
    module = models.build(name)
    variables = _random_variables(module, seed=1)
    out = hf.save(module, variables, str(tmp_path / name))
    assert json.load(open(os.path.join(out, "config.json")))["architectures"] == [hf_class]
    _, info = getattr(transformers, hf_class).from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    _assert_exact_roundtrip(module, variables, tmp_path)


# ----------------------------------------------------------------------------- failures

def test_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(hf.HFConversionError, match="unsupported model_type 'llama'"):
        hf.load(str(tmp_path))


def test_missing_and_mismatched_tensors_are_named(tmp_path):
    from safetensors.numpy import load_file, save_file
    model = transformers.BertForMaskedLM(transformers.BertConfig(**ENCODER_SMALL))
    path = _save(model, tmp_path)
    weights = load_file(os.path.join(path, "model.safetensors"))
    name = "bert.encoder.layer.1.attention.self.key.weight"
    broken = {k: v for k, v in weights.items() if k != name}
    save_file(broken, os.path.join(path, "model.safetensors"))
    with pytest.raises(hf.HFConversionError, match=rf"missing tensor '{name}' \(expected shape \(32, 32\)\)"):
        hf.load(path)
    broken[name] = np.zeros((32, 16), np.float32)
    save_file(broken, os.path.join(path, "model.safetensors"))
    with pytest.raises(hf.HFConversionError, match=rf"tensor '{name}' has shape \(32, 16\), expected \(32, 32\)"):
        hf.load(path)


def test_pytorch_bin_is_read_with_weights_only(tmp_path):
    model = transformers.BertForMaskedLM(transformers.BertConfig(**ENCODER_SMALL))
    path = _save(model, tmp_path)
    os.remove(os.path.join(path, "model.safetensors"))
    torch.save(model.state_dict(), os.path.join(path, "pytorch_model.bin"))
    module, variables = hf.load(path)
    np.testing.assert_array_equal(np.asarray(variables["params"]["token_embedder"]["embedding"]),
                                  model.bert.embeddings.word_embeddings.weight.detach().numpy())
    torch.save({"evil": object()}, os.path.join(path, "pytorch_model.bin"))
    with pytest.raises(Exception, match="(?i)weights.only|unsupported global"):
        hf.load(path)


def test_export_refuses_what_hf_cannot_express(tmp_path):
    cfg = models.get_config("gpt2_tiny", position_encoding="rotary")
    with pytest.raises(hf.HFConversionError, match="position_encoding='rotary'"):
        hf.save(cfg, {"params": {}}, str(tmp_path))


@pytest.mark.parametrize("legacy", [False, True])
def test_deberta_v3_parity(tmp_path, legacy):
    config = transformers.DebertaV2Config(**{**ENCODER_SMALL, "max_position_embeddings": 64}, type_vocab_size=0,
                                          relative_attention=True, position_biased_input=False, share_att_key=True,
                                          pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", position_buckets=4,
                                          max_relative_positions=16, legacy=legacy, tie_word_embeddings=legacy)
    # The v3 head (legacy=False) multiplies by the word embeddings and has no output matrix to tie;
    # tie_word_embeddings would make transformers 4.x tie its dense layer to the embeddings instead.
    model = transformers.DebertaV2ForMaskedLM(config).eval()
    module, variables, features = _encoder_parity(model, tmp_path, token_types=False)
    assert module.config.position_encoding == "disentangled"
    _assert_exact_roundtrip(module, variables, tmp_path)
    # t5lite's folder loads into this transformers as the model it came from.
    exported = transformers.DebertaV2ForMaskedLM.from_pretrained(str(tmp_path / "roundtrip")).eval()
    ids = _torch(features["encoder_input_tokens"])
    with torch.no_grad():
        _assert_close(exported(input_ids=ids).logits.numpy(), model(input_ids=ids).logits.numpy())
