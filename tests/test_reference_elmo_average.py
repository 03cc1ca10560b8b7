"""`t5lite embed` of an ELMo run against allennlp's `elmo --average`.

`allennlp_elmo_average` transcribes allennlp/commands/elmo.py, `ElmoEmbedder.embed_file` with
output_format "average": the sentences, in file order, through `embed_sentences` in batches of
`batch_size`, each sentence's [3, tokens, dim] layers (the token layer twice, then both LSTM
layers: `_ElmoBiLm.forward`) averaged by `numpy.average(embeddings, axis=0)`. allennlp is not
installed: its stateful `ElmoEmbedder` is stood in for by t5lite's stateful `Embedder`, whose
outputs tests/test_elmo.py checks against the TensorFlow bilm's stored ones on the same fixture.
"""
import json

import numpy
import pytest
from conftest import assert_close, shared_data_dir

from t5lite import cli
from t5lite.infer import embedding
from t5lite.interop import elmo

ELMO = shared_data_dir() / "elmo"
pytestmark = pytest.mark.usefixtures("clean_gin_state")


def allennlp_elmo_average(embedder, sentences, batch_size):
    """allennlp/commands/elmo.py, ElmoEmbedder.embed_file(..., output_format="average", batch_size)."""
    outputs = []
    for embeddings in embedder.embed_sentences(sentences, batch_size):
        outputs.append(numpy.average(embeddings, axis=0))
    return outputs


@pytest.fixture(scope="module")
def elmo_run(tmp_path_factory):
    pytest.importorskip("h5py", reason="the bilm weights are hdf5")
    run = tmp_path_factory.mktemp("elmo") / "run"
    cli.main(["convert", "--from_elmo", str(ELMO / "lm_weights.hdf5"), "--elmo_options", str(ELMO / "options.json"),
              "--out", str(run)])
    return str(run)


def _allennlp(texts, batch_size):
    module, variables = elmo.load(str(ELMO / "options.json"), str(ELMO / "lm_weights.hdf5"))
    averaged = allennlp_elmo_average(elmo.Embedder(module, variables), [t.split() for t in texts], batch_size)
    return numpy.stack([a.mean(axis=0) for a in averaged])   # t5lite's mean pooling over the tokens


def test_one_batch_embeds_as_allennlps_elmo_average_mean_pooled(elmo_run):
    texts = json.loads((ELMO / "sentences.json").read_text())[0][:3]
    ours = embedding.embed(texts, checkpoint_path=elmo_run, batch_size=3)
    assert_close(ours, _allennlp(texts, batch_size=3), rtol=1e-5)


def test_later_batches_start_from_zero_states_unlike_allennlps(elmo_run):
    """The difference embed's docstring states: allennlp carries the LSTM states from batch to batch,
    t5lite embeds every batch from zero states, so only the first batch agrees."""
    texts = [s for pair in zip(*json.loads((ELMO / "sentences.json").read_text())) for s in pair][:6]
    ours, theirs = embedding.embed(texts, checkpoint_path=elmo_run, batch_size=3), _allennlp(texts, batch_size=3)
    assert_close(ours[:3], theirs[:3], rtol=1e-5)
    assert not numpy.allclose(ours[3:], theirs[3:], rtol=1e-3)
    assert_close(ours[3:], embedding.embed(texts[3:], checkpoint_path=elmo_run, batch_size=3), rtol=1e-5)
