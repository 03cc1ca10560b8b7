"""Decoding sharded on a mesh (batch over `data`, heads over `model`) gives one device's tokens:
T5 and GPT-2, greedy and beam, on 8 simulated CPU devices in a subprocess."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

WORKER = Path(__file__).with_name("decode_sharding_worker.py")


def test_sharded_decoding_gives_one_devices_tokens(tmp_path):
    out = tmp_path / "decode.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WORKER.parent.parent), str(WORKER.parent)])}
    proc = subprocess.run([sys.executable, str(WORKER), str(out)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for name in ("t5", "gpt2"):
        for method in ("greedy", "beam"):
            one = result[f"{name}/{method}/one"]
            assert len(one["tokens"]) == 6 and len(set(map(tuple, one["tokens"]))) > 1
            # Data and model parallel at once; 6 rows over 4 data shards: filled to 8.
            sharded = result[f"{name}/{method}/4x2"]
            assert sharded["tokens"] == one["tokens"], (name, method)
            assert sharded["lengths"] == one["lengths"]
            np.testing.assert_allclose(sharded["scores"], one["scores"], atol=1e-4)
            # The query projection (its heads axis): over `model`, on every device of the mesh.
            assert "model" in sharded["layout"]["spec"] and sharded["layout"]["devices"] == 8
