"""T5 Table 2's shared encoder-decoder (`share_encoder_decoder=True`): the encoder runs the
decoder's layers bidirectionally without cross-attention, so the model equals Hugging Face's T5
whose encoder holds copies of its decoder's self-attention, MLP, norms and relative-position table."""
import dataclasses

import jax
import numpy as np
import pytest

from t5lite.errors import ConfigError
from t5lite.interop import hf
from t5lite.models import get_config
from t5lite.models.transformer import build_module, scan_params

torch = pytest.importorskip("torch", reason="Hugging Face T5 is the reference")
transformers = pytest.importorskip("transformers", reason="Hugging Face T5 is the reference")

V = 64


def _tied_t5(tmp_path):
    """A random HF T5 whose encoder layers are copies of its decoder's (cross-attention aside)."""
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=20, decoder_start_token_id=0)).eval()
    with torch.no_grad():
        for enc, dec in zip(model.encoder.block, model.decoder.block):
            enc.layer[0].load_state_dict(dec.layer[0].state_dict())   # self-attention and its norm
            enc.layer[1].load_state_dict(dec.layer[2].state_dict())   # the MLP and its norm
        model.encoder.final_layer_norm.load_state_dict(model.decoder.final_layer_norm.state_dict())
    model.save_pretrained(str(tmp_path))
    return model


def _inputs():
    rng = np.random.default_rng(0)
    enc = rng.integers(2, V, (2, 11)).astype(np.int32)
    enc[1, 6:] = 0
    dec = rng.integers(2, V, (2, 7)).astype(np.int32)
    dec[:, 0] = 0
    return enc, dec


@pytest.mark.parametrize("scan", [False, True])
def test_shared_encoder_decoder_equals_t5_whose_encoder_copies_its_decoder(scan, tmp_path):
    model = _tied_t5(tmp_path)
    module, variables = hf.load(str(tmp_path))
    cfg = dataclasses.replace(module.config, share_encoder_decoder=True, scan_layers=scan)
    shared = build_module(cfg)
    params = {k: v for k, v in variables["params"].items() if k != "encoder"}
    params = scan_params(params) if scan else params
    enc, dec = _inputs()
    fresh = jax.eval_shape(lambda: shared.init(jax.random.key(0), enc, dec))["params"]
    assert "encoder" not in fresh
    assert jax.tree.map(lambda x: x.shape, jax.tree.map(np.asarray, params)) == jax.tree.map(
        lambda x: x.shape, jax.tree.map(lambda x: getattr(x, "value", x), fresh,
                                        is_leaf=lambda x: hasattr(x, "value")))
    with torch.no_grad():
        mask = torch.tensor(enc != 0)
        ref = model(input_ids=torch.tensor(enc), attention_mask=mask, decoder_input_ids=torch.tensor(dec)).logits
        ref_states = model.encoder(input_ids=torch.tensor(enc), attention_mask=mask).last_hidden_state.numpy()
    logits = np.asarray(shared.apply({"params": params}, encoder_input_tokens=enc, decoder_input_tokens=dec))
    scale = np.abs(ref.numpy()).max()
    np.testing.assert_allclose(logits, ref.numpy(), rtol=1e-5, atol=1e-5 * scale)
    states = np.asarray(shared.apply({"params": params}, enc, method="encode"))
    real = enc != 0
    np.testing.assert_allclose(states[real], ref_states[real], rtol=1e-5, atol=1e-5 * np.abs(ref_states).max())
    separate = sum(np.size(x) for x in jax.tree.leaves(variables["params"]))
    assert sum(np.size(x) for x in jax.tree.leaves(params)) == separate - sum(
        np.size(x) for x in jax.tree.leaves(variables["params"]["encoder"]))


def test_sharing_needs_an_encoder_decoder_of_equal_depths():
    with pytest.raises(ConfigError, match="num_encoder_layers == num_decoder_layers"):
        get_config("t5_tiny", share_encoder_decoder=True, num_decoder_layers=1)
    with pytest.raises(ConfigError, match="arch='encoder_decoder'"):
        get_config("gpt2_tiny", share_encoder_decoder=True)


def test_what_a_shared_encoder_decoder_cannot_do_is_refused_with_the_reason(tmp_path):
    from t5lite.interop.hf.fields import HFConversionError
    from t5lite.models.peft import PrefixTuning, PromptTuning
    cfg = get_config("t5_tiny", share_encoder_decoder=True)
    with pytest.raises(HFConversionError, match="no Hugging Face architecture"):
        hf.model_type_of(cfg)
    with pytest.raises(ConfigError, match="PromptTuning on a shared encoder-decoder"):
        PromptTuning.stack(cfg)
    with pytest.raises(ConfigError, match="PrefixTuning needs a prefix per layer and stack"):
        PrefixTuning.num_rows(cfg)
