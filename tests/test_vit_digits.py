"""Image classification with a ViT: the `digits` task (scikit-learn's bundled digits, read here
independently), the `image_classification` converter, and configs/local/vit_tiny_digits.gin training
end to end (a few steps here; the shipped step count, slow, well above chance)."""
import json
import os

import gin
import jax
import numpy as np
import pytest
from conftest import REPO

from t5lite import cli, models
from t5lite.data import catalog, converter_registry, tasks_show
from t5lite.errors import ConfigError, DataError, DataNotFoundError
from t5lite.models import vision
from t5lite.objectives.image_classification import ImageClassificationObjective

sklearn_datasets = pytest.importorskip("sklearn.datasets", reason="the digits' reference (extra 'metrics')")

CONFIG = str(REPO / "configs/local/vit_tiny_digits.gin")
pytestmark = pytest.mark.usefixtures("clean_gin_state")


def test_digits_splits_are_disjoint_and_hold_sklearns_images():
    task = catalog.get_task("digits")
    train, validation = (list(task.get_dataset(split)) for split in ("train", "validation"))
    assert (len(train), len(validation)) == (1437, 360)
    train_ids, validation_ids = {ex["idx"] for ex in train}, {ex["idx"] for ex in validation}
    assert not train_ids & validation_ids and len(train_ids | validation_ids) == 1797
    reference = sklearn_datasets.load_digits()
    for ex in validation[:50] + train[:50]:
        assert ex["inputs"].shape == (8, 8, 1) and ex["inputs"].dtype == np.float32
        np.testing.assert_array_equal(ex["inputs"][..., 0], reference.images[ex["idx"]].astype(np.float32) / 16)
        assert ex["label"] == reference.target[ex["idx"]]
    assert [ex["idx"] for ex in task.get_dataset("validation")] == [ex["idx"] for ex in validation]   # fixed


def test_tasks_show_prints_an_image_s_shape_and_label():
    lines = []
    tasks_show.show_examples(catalog.get_task("digits"), "validation", 1, out=lines.append)
    first = next(catalog.get_task("digits").get_dataset("validation"))
    assert lines[1] == f"inputs: image [8, 8, 1] float32, values 0 to 1; label {first['label']}"


def test_converter_rows_and_refusals():
    converter = converter_registry.get_feature_converter("image_classification")
    examples = list(catalog.get_task("digits").get_dataset("validation"))[:3]
    rows = list(converter.convert(examples, {"inputs": 8}))
    assert rows[0][vision.IMAGES].shape == (8, 8, 1) and rows[0]["label"].tolist() == [examples[0]["label"]]
    assert converter.model_feature_lengths({"inputs": 8}) == {vision.IMAGES: 8, "label": 1}
    with pytest.raises(DataError, match=r"TASK_FEATURE_LENGTHS\['inputs'\]=28"):
        list(converter.convert(examples, {"inputs": 28}))
    with pytest.raises(ConfigError, match="train.pack = False"):
        converter.model_feature_lengths({"inputs": 8}, pack=True)


def test_objective_reads_images_with_either_pooling_and_refuses_a_text_model():
    for pooling in ("cls", "mean"):
        objective = ImageClassificationObjective(num_labels=10)
        config = models.get_config("vit_tiny", image_pooling=pooling,
                                   max_position_embeddings=17 if pooling == "cls" else 16)
        module = objective.build_model(config)
        params = module.init(jax.random.PRNGKey(0), **objective.init_features({}))["params"]
        assert ("cls" in params["backbone"]["encoder"]["patch_embedder"]) == (pooling == "cls")
        batch = {vision.IMAGES: vision.example_images(config, 4), "label": np.zeros((4, 1), np.int32)}
        assert objective.apply(module, params, batch).shape == (4, 10)
    with pytest.raises(ConfigError, match="vit_"):
        ImageClassificationObjective().build_model(models.get_config("bert_tiny"))


def test_tfds_tasks_refuse_in_one_line_without_the_prepared_data(tmp_path):
    with pytest.raises(DataNotFoundError) as error:
        catalog.get_task("mnist").source.records("train", data_dir=str(tmp_path))
    assert "tfds build mnist" in str(error.value) and "\n" not in str(error.value)


def _train(run, *bindings):
    cli.main(["train", f"--gin_file={CONFIG}", f"--gin.MODEL_DIR='{run}'", *bindings])
    gin.clear_config()
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _dev_accuracy(records):
    return [r["eval_accuracy"] for r in records if "eval_accuracy" in r][-1]


def test_shipped_config_trains_a_few_steps_end_to_end_and_t5lite_eval_scores_the_run(tmp_path):
    run = str(tmp_path / "run")
    records = _train(run, "--gin.TRAIN_STEPS=4", "--gin.train.eval_every=4", "--gin.train.log_every=2",
                     "--gin.train.checkpoint_every=4", "--gin.train.eval_max_examples=16",
                     "--gin.train.eval_batch_size=16")
    assert np.isfinite([r["loss"] for r in records if "loss" in r][-1])
    # Throughput counts an image's tokens as ViT does, its patches and [CLS]: (8 / 2)^2 + 1 = 17 each.
    speeds = [r for r in records if "tokens_per_sec" in r][-1]
    assert speeds["tokens_per_sec"] == pytest.approx(17 * speeds["rows_per_sec"], rel=1e-6)
    assert speeds["real_tokens_per_sec"] == pytest.approx(speeds["tokens_per_sec"], rel=1e-6)
    assert speeds["mfu"] == pytest.approx(speeds["padded_mfu"], rel=1e-6) and speeds["mfu"] > 0
    cli.main(["eval", f"--gin_file={CONFIG}", f"--gin.MODEL_DIR='{run}'", "--gin.eval.max_examples=16"])
    with open(os.path.join(run, "eval", "digits.validation", "metrics.jsonl")) as f:
        assert json.loads(f.readline())["accuracy"] == _dev_accuracy(records)   # the same 16 digits, same params


@pytest.mark.slow
def test_shipped_config_learns_digits_well_above_chance(tmp_path):
    """At the shipped 1500 steps (the guide's run: 360 validation digits), far above chance's 10%."""
    assert _dev_accuracy(_train(str(tmp_path / "run"))) > 80
