"""`t5lite convert --from_hf` of a Hugging Face `VisionEncoderDecoderModel` folder (ViT encoder, GPT-2
decoder with cross-attention): the imported run's logits and greedy tokens equal transformers' (its
forward pass and `generate`, run here on the same folder), `t5lite eval` scores it as a
`vit_gpt2_tiny` run, `--to_hf` writes a folder transformers reads back to the same logits, and a
folder t5lite's model cannot represent stops with one line, exit code 2, nothing written; a ViT run goes
out with `--to_hf` as well."""
import gin
import numpy as np
import pytest
from conftest import assert_close, run_cli
from test_image_to_text import eval_eight_digits

from t5lite.infer import decoding, predict
from t5lite.models import build, vision
from t5lite.models.config import load_config
from t5lite.run_layout import RunDir

torch = pytest.importorskip("torch", reason="torch is the Hugging Face reference (extra 'hf')")
transformers = pytest.importorskip("transformers", reason="the Hugging Face reference (extra 'hf')")

# vit_gpt2_tiny's sizes: 8 x 8 x 1 images in 2 x 2 patches (16 + [CLS] positions), 2 + 2 layers of 64,
# the tiny vocabularies' 2176 rows; decoding starts from 0 and ends at 1, as the digits task's targets.
ENCODER = dict(image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, hidden_act="gelu", layer_norm_eps=1e-12)
DECODER = dict(vocab_size=2176, n_positions=17, n_embd=64, n_layer=2, n_head=4, n_inner=128,
               activation_function="gelu", layer_norm_epsilon=1e-12)
# Released pairings (nlpconnect/vit-gpt2-image-captioning) keep each half's own settings: ViT's erf
# GELU and 1e-12 epsilon over its patches, GPT-2's tanh GELU and 1e-5 over its own position table.
PAIRINGS = {"one setting": {},
            "each half its own": dict(decoder=transformers.GPT2Config(**{**DECODER, "activation_function": "gelu_new",
                                                                         "layer_norm_epsilon": 1e-5, "n_positions": 64}))}


def _folder(path, encoder=None, decoder=None, **encoder_decoder):
    """A VisionEncoderDecoderModel with N(0, 0.3) weights (HF's init and unit norms would hide a swapped
    tensor), saved with save_pretrained; `encoder`, `decoder`: other configs for the halves."""
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        encoder or transformers.ViTConfig(**ENCODER), decoder or transformers.GPT2Config(**DECODER))
    for name, value in {"decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1, **encoder_decoder}.items():
        setattr(config, name, value)
    model = transformers.VisionEncoderDecoderModel(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    model.save_pretrained(str(path))
    return model.eval()


def _imported(tmp_path, capsys, **folder):
    reference = _folder(tmp_path / "hf", **folder)
    run = str(tmp_path / "run")
    code, out, err = run_cli(capsys, "convert", "--from_hf", str(tmp_path / "hf"), "--out", run)
    assert code == 0, err
    assert out.strip().splitlines() == [f"wrote t5lite checkpoint {run} (encoder_decoder); fine-tune from it with "
                                        f"--gin.INITIAL_CHECKPOINT_PATH=\"'{run}'\""]
    config = load_config(str(RunDir(run).model_config))
    module = build(config)
    params, _, _ = predict.load_params(config, run, module=module)
    return reference, run, module, params


def _inputs(batch=3, length=6):
    rng = np.random.RandomState(0)
    pixels = rng.normal(size=(batch, 1, 8, 8)).astype(np.float32)    # HF's [b, C, H, W]
    return pixels, rng.randint(2, 2176, size=(batch, length))


def _hf_logits(model, pixels, tokens):
    with torch.no_grad():
        return model(pixel_values=torch.tensor(pixels), decoder_input_ids=torch.tensor(tokens)).logits.numpy()


def _logits(module, params, pixels, tokens):
    return module.apply({"params": params}, encoder_input_images=pixels.transpose(0, 2, 3, 1),
                        decoder_input_tokens=tokens)


@pytest.mark.parametrize("pairing", list(PAIRINGS))
@pytest.mark.usefixtures("clean_gin_state")
def test_imported_run_gives_transformers_logits_and_greedy_tokens(tmp_path, capsys, pairing):
    reference, _, module, params = _imported(tmp_path, capsys, **PAIRINGS[pairing])
    pixels, tokens = _inputs()
    want = _hf_logits(reference, pixels, tokens)
    assert_close(_logits(module, params, pixels, tokens), want, rtol=1e-4)
    assert np.abs(want).max() > 1   # logits of real size, so the tolerance is not vacuous
    steps = 6
    with torch.no_grad():   # HF's greedy search: the start id, then one argmax a step; pad after EOS
        hf = reference.generate(pixel_values=torch.tensor(pixels), max_new_tokens=steps, do_sample=False,
                                num_beams=1).numpy()[:, 1:]
    got = decoding.greedy(module, params, {vision.IMAGES: pixels.transpose(0, 2, 3, 1)},
                          max_decode_length=steps).tokens
    want_tokens = np.zeros((len(pixels), steps), np.int64)   # generate stops early once every row has ended
    want_tokens[:, :hf.shape[1]] = hf
    np.testing.assert_array_equal(np.asarray(got), want_tokens)


@pytest.mark.usefixtures("clean_gin_state")
def test_t5lite_eval_scores_the_imported_run_on_digits_to_words(tmp_path, capsys):
    _, run, _, _ = _imported(tmp_path, capsys)
    eval_eight_digits(capsys, run)


@pytest.mark.parametrize("pairing", list(PAIRINGS))
@pytest.mark.usefixtures("clean_gin_state")
def test_to_hf_writes_a_folder_transformers_reads_back_to_the_same_logits(tmp_path, capsys, pairing):
    reference, run, _, _ = _imported(tmp_path, capsys, **PAIRINGS[pairing])
    code, out, err = run_cli(capsys, "convert", "--to_hf", run, "--out", str(tmp_path / "back"))
    assert code == 0 and out.strip() == f"wrote Hugging Face folder {tmp_path / 'back'}", err
    back = transformers.VisionEncoderDecoderModel.from_pretrained(str(tmp_path / "back")).eval()
    pixels, tokens = _inputs()
    np.testing.assert_array_equal(_hf_logits(back, pixels, tokens), _hf_logits(reference, pixels, tokens))
    assert (back.config.decoder_start_token_id, back.config.pad_token_id, back.config.eos_token_id) == (0, 0, 1)
    for half, fields in {"encoder": ("hidden_act", "layer_norm_eps", "image_size", "patch_size"),
                         "decoder": ("activation_function", "layer_norm_epsilon", "n_positions")}.items():
        got, want = back.config.to_dict()[half], reference.config.to_dict()[half]
        assert {f: got[f] for f in fields} == {f: want[f] for f in fields}


REFUSED = {
    "encoder not ViT": (dict(encoder=transformers.DeiTConfig(**ENCODER)), "encoder.model_type='deit'"),
    "decoder not GPT-2": (dict(decoder=transformers.BertConfig(vocab_size=2176, hidden_size=64, num_hidden_layers=2,
                                                               num_attention_heads=4, intermediate_size=128)),
                          "decoder.model_type='bert'"),
    "another width": (dict(decoder=transformers.GPT2Config(**{**DECODER, "n_embd": 32})),
                      "decoder.n_embd=32 differs from encoder.hidden_size=64"),
    "another MLP width": (dict(decoder=transformers.GPT2Config(**{**DECODER, "n_inner": 96})),
                          "decoder.n_inner=96 differs from encoder.intermediate_size=128"),
    "unscaled attention": (dict(decoder=transformers.GPT2Config(**{**DECODER, "scale_attn_weights": False})),
                           "decoder.scale_attn_weights=False differs"),
}


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.usefixtures("clean_gin_state")
def test_a_folder_t5lite_cannot_represent_is_one_line_and_exit_2(tmp_path, capsys, case):
    folder, expected = REFUSED[case]
    _folder(tmp_path / "hf", **folder)
    code, _, err = run_cli(capsys, "convert", "--from_hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and expected in err, err
    assert str(tmp_path / "hf" / "config.json") in err
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("clean_gin_state")
def test_a_vit_run_goes_out_with_to_hf_too(tmp_path, capsys):
    """--to_hf builds the model with images to read the run: an encoder-only ViT run as well."""
    model = transformers.ViTModel(transformers.ViTConfig(**ENCODER), add_pooling_layer=False).eval()
    model.save_pretrained(str(tmp_path / "hf"))
    run, back = str(tmp_path / "run"), str(tmp_path / "back")
    assert run_cli(capsys, "convert", "--from_hf", str(tmp_path / "hf"), "--out", run)[0] == 0
    code, _, err = run_cli(capsys, "convert", "--to_hf", run, "--out", back)
    assert code == 0, err
    pixels = torch.tensor(_inputs()[0])
    with torch.no_grad():
        np.testing.assert_array_equal(transformers.ViTModel.from_pretrained(back).eval()(pixels).last_hidden_state,
                                      model(pixels).last_hidden_state)


def test_decoder_overrides_are_refused_where_they_cannot_apply_and_survive_a_saved_config(tmp_path):
    from t5lite.errors import ConfigError
    from t5lite.models.config import get_config, save_config
    with pytest.raises(ConfigError, match="a decoder may differ from its encoder in"):
        get_config("vit_gpt2_tiny", decoder_overrides=(("d_model", 32),))          # a width: another shape
    with pytest.raises(ConfigError, match="arch='encoder_decoder'"):
        get_config("gpt2_tiny", decoder_overrides=(("layer_norm_epsilon", 1e-5),))
    with pytest.raises(ConfigError, match="give a tuple of 1"):
        get_config("vit_gpt2_tiny", decoder_overrides=(("mlp_activations", ("gelu", "linear")),))
    config = get_config("vit_gpt2_tiny", decoder_overrides=(("mlp_activations", ("gelu",)), ("max_position_embeddings", 64)))
    save_config(config, str(tmp_path / "model_config.json"))
    assert load_config(str(tmp_path / "model_config.json")) == config
    decoder = config.decoder_config()
    assert (decoder.mlp_activations, decoder.max_position_embeddings, decoder.image_size) == (("gelu",), 64, 0)
    assert config.decoder_config().layer_norm_epsilon == config.layer_norm_epsilon
