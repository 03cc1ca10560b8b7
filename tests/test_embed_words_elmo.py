"""`t5lite embed` for the models without a [CLS]: a word-vector file (GloVe) and a word2vec run give
what sentence-transformers' average word embeddings give on the same vectors; an ELMo run gives its
layers averaged (allennlp's `elmo --average`) and mean-pooled over the tokens."""
import json

import gin
import numpy as np
import pytest
from conftest import assert_close, shared_data_dir, write_glove

from t5lite import cli
from t5lite.interop import elmo

pytestmark = pytest.mark.usefixtures("clean_gin_state")
TEXTS = ["A man is playing a guitar.", "The new movie is awesome!", "zzzqx unknownword", "Paris, France"]
ELMO = shared_data_dir() / "elmo"


def _embed(out, *args):
    gin.clear_config()
    cli.main(["embed", f"--output={out}", *args])
    return np.load(out)


def _average_word_embeddings(vectors_file, texts, pooling="mean"):
    """sentence-transformers' WordEmbeddings (its tokenizer without stop words) + Pooling (mean or max)."""
    st = pytest.importorskip("sentence_transformers", reason="the reference average word embeddings")
    from sentence_transformers.models import Pooling, WordEmbeddings
    from sentence_transformers.models.tokenizer import WhitespaceTokenizer
    words = WordEmbeddings.from_text_file(str(vectors_file), tokenizer=WhitespaceTokenizer(stop_words=[]))
    model = st.SentenceTransformer(modules=[words, Pooling(words.get_embedding_dimension(), pooling)], device="cpu")
    return model.encode(texts)


def test_a_glove_file_embeds_as_sentence_transformers_average_word_embeddings(tmp_path):
    glove = write_glove(tmp_path / "glove.5k.50d.txt", 5_000)
    ours = _embed(tmp_path / "v.npy", f"--gin.CHECKPOINT_PATH='{glove}'", *TEXTS)
    assert ours.shape == (len(TEXTS), 50) and ours.dtype == np.float32
    assert_close(ours, _average_word_embeddings(glove, TEXTS), rtol=1e-5)
    assert not ours[2].any()          # no known word: zeros, as sentence-transformers' clamped mean
    unit = _embed(tmp_path / "u.npy", f"--gin.CHECKPOINT_PATH='{glove}'", "--gin.embed.normalize=True", TEXTS[0])
    assert_close(unit[0], ours[0] / np.linalg.norm(ours[0]), rtol=1e-5)


def test_a_word2vec_run_embeds_with_its_vectors(tmp_path):
    from test_word2vec import _train
    run = tmp_path / "w2v"
    _train(run, 2, "BATCH_SIZE=4", "model_config.overrides={'dim': 8}")
    ours = _embed(tmp_path / "v.npy", f"--gin.CHECKPOINT_PATH='{run}'", *TEXTS)
    assert ours.shape == (len(TEXTS), 8)
    assert_close(ours, _average_word_embeddings(run / "vectors.txt", TEXTS), rtol=1e-5)
    maxed = _embed(tmp_path / "m.npy", f"--gin.CHECKPOINT_PATH='{run}'", "--gin.embed.pooling='max'", *TEXTS[:2])
    assert_close(maxed, _average_word_embeddings(run / "vectors.txt", TEXTS[:2], "max"), rtol=1e-6)
    (run / "vectors.txt").unlink()
    with pytest.raises(SystemExit) as exit_:
        _embed(tmp_path / "x.npy", f"--gin.CHECKPOINT_PATH='{run}'", "text")
    assert exit_.value.code == 2


def test_an_elmo_run_embeds_its_averaged_layers_mean_pooled(tmp_path, capsys):
    run = tmp_path / "elmo"
    cli.main(["convert", "--from_elmo", str(ELMO / "lm_weights.hdf5"), "--elmo_options", str(ELMO / "options.json"),
              "--out", str(run)])
    sentences = json.loads((ELMO / "sentences.json").read_text())[0][:4]
    ours = _embed(tmp_path / "v.npy", f"--gin.CHECKPOINT_PATH='{run}'", *sentences)
    module, variables = elmo.load(str(ELMO / "options.json"), str(ELMO / "lm_weights.hdf5"))
    layers = elmo.embed(module, variables, [s.split() for s in sentences])
    expected = np.stack([x.mean(axis=0).mean(axis=0) for x in layers])     # layers averaged, then tokens
    assert ours.shape == (4, 32)
    assert_close(ours, expected, rtol=1e-5)
    with pytest.raises(SystemExit) as exit_:
        _embed(tmp_path / "c.npy", f"--gin.CHECKPOINT_PATH='{run}'", "--gin.embed.pooling='cls'", "text")
    assert exit_.value.code == 2 and "'mean' or 'max'" in capsys.readouterr().err
