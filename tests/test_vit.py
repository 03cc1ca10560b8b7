"""The Vision Transformer: t5lite's encoder on patches equals Hugging Face's `ViTModel` and
`ViTForImageClassification` (transformers, run here) on the same weights and images; `t5lite
convert --from_hf` imports a ViT folder and `hf.save` writes one back; the presets have the Hugging
Face models' parameter counts."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close

torch = pytest.importorskip("torch", reason="torch is the Hugging Face reference (extra 'hf')")
transformers = pytest.importorskip("transformers", reason="the Hugging Face reference (extra 'hf')")

from t5lite import models  # noqa: E402
from t5lite.errors import ConfigError  # noqa: E402
from t5lite.interop import hf  # noqa: E402
from t5lite.models import vision  # noqa: E402

TINY = dict(image_size=8, patch_size=2, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64)


def _randomised(model):
    """Every weight drawn from N(0, 0.3) (HF's 0.02 init and unit norms would hide a swapped tensor)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """(ViTModel folder, its model; ViTForImageClassification folder, its model), random weights."""
    root = tmp_path_factory.mktemp("vit")
    base = _randomised(transformers.ViTModel(transformers.ViTConfig(**TINY)))
    classifier = _randomised(transformers.ViTForImageClassification(transformers.ViTConfig(**TINY, num_labels=5)))
    base.save_pretrained(root / "base")
    classifier.save_pretrained(root / "classifier")
    return str(root / "base"), base, str(root / "classifier"), classifier


def _images(seed=0, batch=3):
    """Random images as HF reads them [b, C, H, W], and as t5lite does [b, H, W, C]."""
    pixels = np.random.RandomState(seed).normal(size=(batch, 3, 8, 8)).astype(np.float32)
    return pixels, jnp.asarray(pixels.transpose(0, 2, 3, 1))


def test_last_hidden_state_and_pooler_equal_vit_model(hf_folders):
    path, reference, _, _ = hf_folders
    pixels, images = _images()
    with torch.no_grad():
        want = reference(torch.tensor(pixels))
    module, variables = hf.load(path)
    assert module.config.image_positions == 17 and module.config.pooler
    assert_close(module.apply(variables, encoder_input_images=images, method="encode"),
                 want.last_hidden_state.numpy(), rtol=1e-4)
    assert_close(module.apply(variables, encoder_input_images=images, method="pool"), want.pooler_output.numpy(),
                 rtol=1e-4)


def test_logits_equal_vit_for_image_classification(hf_folders):
    _, _, path, reference = hf_folders
    pixels, images = _images(seed=1)
    with torch.no_grad():
        want = reference(torch.tensor(pixels)).logits.numpy()
    model, variables = hf.load_classifier(path)
    logits = model.apply(variables, encoder_input_images=images)
    assert logits.shape == (3, 5)
    assert_close(logits, want, rtol=1e-4)


def test_a_wrong_patch_order_is_caught(hf_folders, monkeypatch):
    """Patches flattened column by column (or with each patch transposed) no longer match: the
    parity above can fail."""
    path, reference, _, _ = hf_folders
    pixels, images = _images()
    with torch.no_grad():
        want = reference(torch.tensor(pixels)).last_hidden_state.numpy()
    module, variables = hf.load(path)
    right = vision.patches
    for wrong in (lambda x, p: right(x.transpose(0, 2, 1, 3), p),                       # column-major patches
                  lambda x, p: right(x, p).transpose(0, 1, 3, 2, 4)):                     # each patch transposed
        monkeypatch.setattr(vision, "patches", wrong)
        got = np.asarray(module.apply(variables, encoder_input_images=images, method="encode"))
        assert np.max(np.abs(got - want)) > 100 * 1e-4 * np.max(np.abs(want))


def test_save_writes_a_folder_vit_model_reads(hf_folders, tmp_path):
    path, reference, _, _ = hf_folders
    module, variables = hf.load(path)
    hf.save(module, variables, str(tmp_path / "back"))
    back = transformers.ViTModel.from_pretrained(str(tmp_path / "back")).eval()
    pixels, _ = _images(seed=2)
    with torch.no_grad():
        np.testing.assert_array_equal(back(torch.tensor(pixels)).last_hidden_state.numpy(),
                                      reference(torch.tensor(pixels)).last_hidden_state.numpy())


def test_cli_convert_imports_a_vit_folder(hf_folders, tmp_path, capsys):
    from t5lite import cli
    from t5lite.infer.checkpoint_reader import restore_params
    from t5lite.models.config import load_config
    from t5lite.run_layout import RunDir
    path = hf_folders[0]
    cli.main(["convert", "--from_hf", path, "--out", str(tmp_path / "run")])
    assert "wrote t5lite checkpoint" in capsys.readouterr().out
    config = load_config(str(RunDir(str(tmp_path / "run")).model_config))
    module, variables = hf.load(path)
    assert config == module.config
    restored = restore_params(str(tmp_path / "run"), variables["params"])
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), restored,
                 variables["params"])


@pytest.mark.parametrize("preset, hidden, heads, ff", [("vit_ti16", 192, 3, 768), ("vit_s16", 384, 6, 1536),
                                                       ("vit_b16", 768, 12, 3072)])
def test_presets_have_the_hf_parameter_counts(preset, hidden, heads, ff):
    """ViTModel without its pooler (as ViTForImageClassification holds it), built on the meta device."""
    with torch.device("meta"):
        reference = transformers.ViTModel(transformers.ViTConfig(hidden_size=hidden, num_attention_heads=heads,
                                                                 intermediate_size=ff), add_pooling_layer=False)
    want = sum(p.numel() for p in reference.parameters())
    config = models.get_config(preset)
    module = models.build(config)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), encoder_input_images=vision.example_images(
        config)))["params"]
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)) == want


def test_an_image_model_refuses_tokens_and_the_wrong_image_size():
    config = models.get_config("vit_tiny")
    module = models.build(config)
    with pytest.raises(ConfigError, match="encoder_input_images"):
        module.init(jax.random.PRNGKey(0), encoder_input_tokens=jnp.ones((1, 4), jnp.int32))
    with pytest.raises(ConfigError, match=r"\[batch, 8, 8, 1\]"):
        module.init(jax.random.PRNGKey(0), encoder_input_images=jnp.zeros((1, 28, 28, 1)))
    with pytest.raises(ConfigError, match="multiple of patch_size"):
        models.get_config("vit_tiny", patch_size=3)
