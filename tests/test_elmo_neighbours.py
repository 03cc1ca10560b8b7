"""`t5lite probe --neighbours` on an ELMo run (the fixture biLM converted with `elmo.to_run`): each
occurrence's neighbours and cosines equal a numpy re-derivation on `t5lite.interop.elmo.embed`."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import shared_data_dir
from t5lite import cli
from t5lite.interop import elmo

ELMO = shared_data_dir() / "elmo"
CORPUS = ("we play a game . they play music .\nthe play was long and the bank was closed .\n"
          "we sat on the bank of the river . children play outside .\n")


def _numpy_neighbours(vectors: dict, queries: list, k: int):
    """Per query place, its k best other places by cosine: [(place, cosine)]."""
    places = list(vectors)
    unit = np.stack([vectors[p] / np.linalg.norm(vectors[p]) for p in places])
    out = []
    for q in queries:
        cosine = unit @ unit[places.index(q)]
        order = [n for n in np.argsort(-cosine, kind="stable") if places[n] != q][:k]
        out.append([(places[n], float(cosine[n])) for n in order])
    return out


@pytest.mark.parametrize("pool, layer", [("same", 2), ("all", 1), ("all", 2)])
def test_elmo_neighbours_equal_numpy_cosines_on_elmo_embed(pool, layer, tmp_path, capsys):
    run = tmp_path / "elmo_run"
    elmo.to_run(str(ELMO / "options.json"), str(ELMO / "lm_weights.hdf5"), str(run))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    out = tmp_path / "out"
    cli.main(["probe", "--model", str(run), "--out", str(out), "--neighbours", "play", "--corpus", str(corpus),
              "--k", "3", "--pool", pool, "--layer", str(layer)])
    result = json.loads((out / "neighbours.json").read_text())

    sentences = [s.split() for s in ["we play a game .", "they play music .", "the play was long and the bank was closed .",
                                     "we sat on the bank of the river .", "children play outside ."]]
    chosen = [s for s in sentences if "play" in s] if pool == "same" else sentences
    module, variables = elmo.load(str(ELMO / "options.json"), str(ELMO / "lm_weights.hdf5"))
    embedded = elmo.embed(module, variables, chosen)
    vectors = {(i, j): embedded[i][layer, j] for i, s in enumerate(chosen) for j, w in enumerate(s)
               if pool == "all" or w == "play"}
    queries = [(i, j) for i, s in enumerate(chosen) for j, w in enumerate(s) if w == "play"]
    expected = _numpy_neighbours(vectors, queries, k=3)

    assert result["layer"] == layer and len(result["occurrences"]) == len(queries) == 4
    for occurrence, (i, j), want in zip(result["occurrences"], queries, expected):
        assert occurrence["sentence"] == " ".join(chosen[i]) and occurrence["index"] == j
        got = [(n["sentence"], n["index"]) for n in occurrence["neighbours"]]
        assert got == [(" ".join(chosen[p[0]]), p[1]) for p, _ in want]
        np.testing.assert_allclose([n["cosine"] for n in occurrence["neighbours"]], [c for _, c in want],
                                   rtol=1e-3, atol=1e-4)    # the JSON keeps 4 decimals
