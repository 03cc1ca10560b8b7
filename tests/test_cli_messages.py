"""`t5lite embed` on a word-vector file says which inputs have no word the vectors know (their
embeddings are zeros), in one warning."""
import logging

import numpy as np
import pytest

from t5lite import cli

pytestmark = pytest.mark.usefixtures("clean_gin_state")


def test_embed_warns_once_of_inputs_without_a_known_word(tmp_path, caplog):
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("sea 0.1 0.2 0.3\nboat 0.3 0.1 0.0\n")
    out = tmp_path / "v.npy"
    cli.main(["embed", f"--gin.CHECKPOINT_PATH='{vectors}'", f"--output={out}", "the sea", "xyzzy", "a boat", "qq zz"])
    embeddings = np.load(out)
    assert not embeddings[[1, 3]].any() and embeddings[[0, 2]].any()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["2 of 4 inputs have no word the vectors know (input 1, 3): their embeddings are zeros"]
