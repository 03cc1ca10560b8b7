"""An encoder-decoder that reads an image and writes text: `vit_gpt2_tiny` (ViT's encoder on
patches, GPT-2's decoder) equals Hugging Face's `VisionEncoderDecoderModel(ViTModel,
GPT2LMHeadModel)` (transformers, run here) on the same weights; the `digits_to_words` task (read
against scikit-learn here), the `image_to_text` converter's padding, and
configs/local/vit_gpt2_digits_to_words.gin training and evaluating end to end."""
import json
import os

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO, assert_close

from t5lite import cli, models
from t5lite.data import catalog, converter_registry
from t5lite.data.vocab import DEFAULT_VOCABULARY
from t5lite.errors import ConfigError, DataError
from t5lite.infer import decoding
from t5lite.interop import hf
from t5lite.interop.hf.vision_encoder_decoder import VisionEncoderDecoderFamily
from t5lite.models import vision

CONFIG = str(REPO / "configs/local/vit_gpt2_digits_to_words.gin")
# The words written by hand, not read from t5lite.
WORDS = {0: "zero", 1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def _params_from_vision_encoder_decoder(cfg, state):
    """t5lite params from a VisionEncoderDecoderModel's state dict by the import's rules (ViT's tensors
    under `encoder.`, GPT-2's with its cross-attention under `decoder.`; `t5lite convert --from_hf`
    reads a saved folder with them, tests/test_vision_encoder_decoder_import.py)."""
    rules = VisionEncoderDecoderFamily.rules(cfg)
    shapes = hf._param_shapes(models.build(cfg))
    flat = {}
    for rule in rules:
        flat.update(zip(rule.ours, rule.from_hf(state[rule.hf].numpy(), [shapes[p] for p in rule.ours])))
    assert flat.keys() == shapes.keys()
    params = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = params
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = jnp.asarray(value)
    return params


def test_logits_equal_hugging_face_vision_encoder_decoder_on_the_same_weights():
    torch = pytest.importorskip("torch", reason="torch is the Hugging Face reference (extra 'hf')")
    transformers = pytest.importorskip("transformers", reason="the Hugging Face reference (extra 'hf')")
    cfg = models.get_config("vit_gpt2_tiny", vocab_size=50, dropout_rate=0.0)
    encoder = transformers.ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128, layer_norm_eps=1e-12)
    decoder = transformers.GPT2Config(vocab_size=50, n_positions=17, n_embd=64, n_layer=2, n_head=4, n_inner=128,
                                      activation_function="gelu", layer_norm_epsilon=1e-12, add_cross_attention=True,
                                      is_decoder=True)
    reference = transformers.VisionEncoderDecoderModel(
        transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder))
    torch.manual_seed(0)
    with torch.no_grad():   # N(0, 0.3) everywhere: HF's init and unit norms would hide a swapped tensor
        for p in reference.parameters():
            p.normal_(0, 0.3)
    reference.eval()
    params = _params_from_vision_encoder_decoder(cfg, reference.state_dict())
    rng = np.random.RandomState(0)
    pixels = rng.normal(size=(3, 1, 8, 8)).astype(np.float32)   # HF's [b, C, H, W]
    tokens = rng.randint(2, 50, size=(3, 6))
    with torch.no_grad():
        want = reference(pixel_values=torch.tensor(pixels), decoder_input_ids=torch.tensor(tokens))
    module, images = models.build(cfg), jnp.asarray(pixels.transpose(0, 2, 3, 1))
    assert_close(module.apply({"params": params}, encoder_input_images=images, method="encode"),
                 want.encoder_last_hidden_state.numpy(), rtol=1e-4)
    got = module.apply({"params": params}, encoder_input_images=images, decoder_input_tokens=jnp.asarray(tokens))
    assert_close(got, want.logits.numpy(), rtol=1e-4)
    # Greedy decoding (cache, one token a step) picks the teacher-forced pass's argmax at each step.
    out = decoding.greedy(module, params, {vision.IMAGES: images}, max_decode_length=4).tokens
    start = jnp.zeros((3, 1), jnp.int32)
    forced = module.apply({"params": params}, encoder_input_images=images,
                          decoder_input_tokens=jnp.concatenate([start, out[:, :-1]], 1))
    np.testing.assert_array_equal(np.asarray(forced.argmax(-1))[out != 0], np.asarray(out)[out != 0])


def test_digits_to_words_holds_sklearns_images_and_their_words():
    datasets = pytest.importorskip("sklearn.datasets", reason="the digits' reference (extra 'metrics')")
    reference = datasets.load_digits()
    examples = list(catalog.get_task("digits_to_words").get_dataset("validation"))
    assert len(examples) == 360
    for ex in examples[:40]:
        np.testing.assert_array_equal(ex["inputs"][..., 0], reference.images[ex["idx"]].astype(np.float32) / 16)
        word = WORDS[int(reference.target[ex["idx"]])]
        assert ex["targets_pretokenized"] == word
        assert ex["targets"].tolist() == DEFAULT_VOCABULARY.encode(word) + [1]   # EOS last
        assert ex["inputs_pretokenized"] == f"digit image {ex['idx']}"


def test_converter_pads_the_words_and_refuses_packing_and_other_sizes():
    converter = converter_registry.get_feature_converter("image_to_text")
    examples = list(catalog.get_task("digits_to_words").get_dataset("validation"))[:3]
    rows = list(converter.convert(examples, {"inputs": 8, "targets": 8}))
    for ex, row in zip(examples, rows):
        n = len(ex["targets"])
        want = np.zeros(8, np.int32)
        want[:n] = ex["targets"]
        np.testing.assert_array_equal(row["decoder_target_tokens"], want)
        np.testing.assert_array_equal(row["decoder_input_tokens"], np.concatenate([[0], want[:-1]]))
        np.testing.assert_array_equal(row["decoder_loss_weights"], (np.arange(8) < n).astype(np.int32))
        np.testing.assert_array_equal(row[vision.IMAGES], ex["inputs"])
    short = next(converter.convert(examples, {"inputs": 8, "targets": 2}))   # cut at the targets' length
    assert short["decoder_target_tokens"].tolist() == examples[0]["targets"][:2].tolist()
    assert converter.model_feature_lengths({"inputs": 8, "targets": 8}) == {
        vision.IMAGES: 8, "decoder_target_tokens": 8, "decoder_input_tokens": 8, "decoder_loss_weights": 8}
    with pytest.raises(ConfigError, match="image_to_text converter gives one image per row: set train.pack = False"):
        list(converter.convert(examples, {"inputs": 8, "targets": 8}, pack=True))
    with pytest.raises(DataError, match=r"TASK_FEATURE_LENGTHS\['inputs'\]=16"):
        list(converter.convert(examples, {"inputs": 16, "targets": 8}))


def test_a_text_model_refuses_images_and_an_image_model_refuses_tokens():
    text = models.get_config("t5_tiny")
    with pytest.raises(ConfigError, match="text model .* fed encoder_input_images"):
        vision.encoder_inputs(text, None, jnp.zeros((1, 8, 8, 1)))
    image = models.get_config("vit_gpt2_tiny")
    with pytest.raises(ConfigError, match="image model"):
        models.build(image).init(jax.random.PRNGKey(0), encoder_input_tokens=jnp.ones((1, 4), jnp.int32),
                                 decoder_input_tokens=jnp.ones((1, 4), jnp.int32))


def _cli(capsys, *args):
    try:
        cli.main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        gin.clear_config()
    return code, capsys.readouterr().err


def eval_eight_digits(capsys, run) -> float:
    """`t5lite eval` of the run on 8 validation digits: their predictions written, and the accuracy
    (returned) the share of them decoded exactly."""
    code, err = _cli(capsys, "eval", f"--gin_file={CONFIG}", f"--gin.MODEL_DIR='{run}'", "--gin.eval.max_examples=8",
                     "--gin.eval.batch_size=8")
    assert code == 0, err
    folder = os.path.join(run, "eval", "digits_to_words.validation")
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        metrics = json.loads(f.readline())
    with open(os.path.join(folder, "predictions.jsonl")) as f:
        predictions = [json.loads(line) for line in f]
    assert len(predictions) == 8 and predictions[0]["inputs"].startswith("digit image ")
    right = sum(p["prediction"] == p["target"] for p in predictions)
    assert metrics["accuracy"] == pytest.approx(100 * right / 8)
    return metrics["accuracy"]


@pytest.mark.usefixtures("clean_gin_state")
def test_shipped_config_trains_a_few_steps_and_t5lite_eval_scores_the_decoded_words(tmp_path, capsys):
    run = str(tmp_path / "run")
    code, err = _cli(capsys, "train", f"--gin_file={CONFIG}", f"--gin.MODEL_DIR='{run}'", "--gin.TRAIN_STEPS=3",
                     "--gin.train.eval_every=3", "--gin.train.log_every=1", "--gin.train.checkpoint_every=3",
                     "--gin.train.eval_max_examples=8", "--gin.train.eval_batch_size=8")
    assert code == 0, err
    with open(os.path.join(run, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert np.isfinite([r["loss"] for r in records if "loss" in r]).all()
    train_time = [r for r in records if "eval_accuracy" in r][-1]
    assert eval_eight_digits(capsys, run) == pytest.approx(train_time["eval_accuracy"])
    code, err = _cli(capsys, "infer", f"--gin.CHECKPOINT_PATH='{run}'", "seven")   # texts only
    assert code == 2 and "is an image model" in err and "decoding.greedy" in err, err


@pytest.mark.usefixtures("clean_gin_state")
def test_an_image_task_with_a_text_model_is_one_line_and_exit_2(tmp_path, capsys):
    code, err = _cli(capsys, "train", f"--gin_file={CONFIG}", f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
                     "--gin.model_config.preset='t5_tiny'", "--gin.TRAIN_STEPS=1")
    assert code == 2 and "vit_gpt2_tiny" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
@pytest.mark.usefixtures("clean_gin_state")
def test_shipped_config_writes_most_validation_digits_right(tmp_path, capsys):
    """At the shipped 1000 steps (the guide's run), most of the 360 validation digits' words are exact."""
    run = str(tmp_path / "run")
    assert _cli(capsys, "train", f"--gin_file={CONFIG}", f"--gin.MODEL_DIR='{run}'")[0] == 0
    with open(os.path.join(run, "metrics.jsonl")) as f:
        assert [json.loads(line) for line in f if "eval_accuracy" in line][-1]["eval_accuracy"] > 80
