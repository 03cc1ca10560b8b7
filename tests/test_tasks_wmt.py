"""WMT tasks on the aligned newstest/newsdev files in ../shared/data/wmt, plus TFDS under mock_data."""
import itertools

import numpy as np
import pytest
from conftest import shared_data_dir

from t5lite import metrics
from t5lite.data import get_task

SHARED = shared_data_dir()  # <repo>/../shared/data or $T5LITE_SHARED_DATA
DEEN, ENRO = str(SHARED / "wmt" / "de-en"), str(SHARED / "wmt" / "en-ro")


def _texts(task, split, data_dir, n=None):
    t = get_task(task)
    return [(ex["inputs"], ex["targets"]) for ex in
            itertools.islice(t.preprocessors[0](t.source.load(split, data_dir=data_dir)), n)]


@pytest.mark.parametrize("task, split, data_dir, index, inputs, targets", [
    ("wmt14_ende", "test", DEEN, 0, "translate English to German: Gutach: Increased safety for pedestrians",
     "Gutach: Noch mehr Sicherheit für Fußgänger"),
    ("wmt14_ende", "validation", DEEN, 1,
     "translate English to German: Republican leaders justified their policy by the need to combat electoral fraud.",
     "Die Führungskräfte der Republikaner rechtfertigen ihre Politik mit der Notwendigkeit, den Wahlbetrug zu "
     "bekämpfen."),
    ("wmt16_enro", "validation", ENRO, 0,
     "translate English to Romanian: Brazil's Former Presidential Chief-of-Staff to Stand Trial",
     "Fostul șef al cabinetului prezidențial brazilian este adus în fața instanței"),
    ("wmt16_enro", "test", ENRO, 0,
     "translate English to Romanian: UN Chief Says There Is No Military Solution in Syria",
     "Șeful ONU declară că nu există soluții militare în Siria"),
])
def test_real_rows(task, split, data_dir, index, inputs, targets):
    assert _texts(task, split, data_dir, index + 1)[index] == (inputs, targets)


def test_split_mapping_and_line_counts():
    assert len(_texts("wmt14_ende", "test", DEEN)) == 3003       # newstest2014-deen
    assert len(_texts("wmt14_ende", "validation", DEEN)) == 3000  # newstest2013
    assert len(_texts("wmt16_enro", "validation", ENRO)) == 1999  # newsdev2016-enro
    files = get_task("wmt16_enro").source.files
    assert files.files("test", ENRO) == [f"{ENRO}/newstest2016-enro"] and files.files("train", ENRO) == []


def test_tokenized_and_bleu():
    task = get_task("wmt14_ende")
    ex = next(task.get_dataset("test", data_dir=DEEN, sequence_length={"inputs": 16, "targets": 16}))
    assert ex["inputs"].dtype == np.int32 and len(ex["inputs"]) <= 16 and ex["inputs"][-1] == 1
    assert task.metric_fns == [metrics.bleu]
    refs = [t for _, t in _texts("wmt14_ende", "test", DEEN, 20)]
    assert metrics.compute_metrics(task.metric_fns, refs, refs)["bleu"] == pytest.approx(100.0)


def test_french_pair_and_misaligned_files(tmp_path):
    (tmp_path / "newstest2014-fren.en").write_text("Hello .\nSee you .\n")
    (tmp_path / "newstest2014-fren.fr").write_text("Bonjour .\nÀ bientôt .\n")
    assert _texts("wmt14_enfr", "test", str(tmp_path)) == [
        ("translate English to French: Hello .", "Bonjour ."),
        ("translate English to French: See you .", "À bientôt .")]
    (tmp_path / "newstest2013.en").write_text("one\ntwo\n")
    (tmp_path / "newstest2013.fr").write_text("un\n")
    with pytest.raises(ValueError, match="not aligned"):
        _texts("wmt14_enfr", "validation", str(tmp_path))


@pytest.mark.parametrize("name, tfds_name, target, language", [
    ("wmt14_ende", "wmt14_translate/de-en", "de", "German"),
    ("wmt14_enfr", "wmt14_translate/fr-en", "fr", "French"),
    ("wmt16_enro", "wmt16_translate/ro-en", "ro", "Romanian"),
])
def test_tfds_source_with_mock_data(name, tfds_name, target, language):
    tfds = pytest.importorskip("tensorflow_datasets", reason="the TFDS path needs tensorflow-datasets")
    task = get_task(name)
    assert task.source.tfds.name == tfds_name
    with tfds.testing.mock_data(num_examples=3, policy=tfds.testing.MockPolicy.USE_CODE):
        raw = list(task.source.load("validation"))
        examples = list(task.get_dataset("validation"))
    assert [e["inputs_pretokenized"] for e in examples] == [f"translate English to {language}: {r['en']}" for r in raw]
    assert [e["targets_pretokenized"] for e in examples] == [r[target] for r in raw]
