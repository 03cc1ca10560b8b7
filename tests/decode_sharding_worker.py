"""Decodes on 8 simulated CPU devices, for tests/test_infer_sharding.py (run in its own process,
since the device count is fixed when JAX starts).

Usage: python decode_sharding_worker.py OUT_JSON CASE...   (CASE: t5/greedy, gpt2/beam, ...)
For each case, a T5 or a GPT-2 (random weights) decoding greedily or with beams: tokens and
scores on one device and on a (data, fsdp, model) mesh (4, 1, 2), with the layout of a query
projection.
"""
import json
import os
import sys

# Added to the flags conftest.py gives every process (-O0).
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from conftest import random_variables  # noqa: E402
from t5lite import models  # noqa: E402
from t5lite.infer.predict import Predictor  # noqa: E402
from t5lite.train.partitioning import Partitioner  # noqa: E402

SMALL = dict(d_model=32, num_heads=4, head_dim=8, d_ff=64, vocab_size=128, dropout_rate=0.0)
CONFIGS = {"t5": models.get_config("t5_tiny", num_encoder_layers=1, num_decoder_layers=1, **SMALL),
           "gpt2": models.get_config("gpt2_tiny", num_decoder_layers=1, eos_token_id=127, decoder_start_token_id=127,
                                     **SMALL)}
MESHES = {"one": ((1, 1, 1), 1), "4x2": ((4, 1, 2), 8)}   # 6 rows over 4 data shards: filled to 8


def inputs(arch, rows=6, width=10):
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 120, (rows, width)).astype(np.int32)
    lengths = rng.integers(3, width + 1, rows).astype(np.int32)
    tokens[np.arange(width)[None] >= lengths[:, None]] = 0
    if arch == "decoder":
        return {"decoder_prompt_tokens": tokens, "decoder_prompt_lengths": lengths}
    return {"encoder_input_tokens": tokens}


def query_layout(params):
    leaf = next(leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)
                if "'query'" in jax.tree_util.keystr(path))
    return {"spec": [str(s) for s in leaf.sharding.spec], "devices": len(leaf.sharding.device_set)}


result = {}
for case in sys.argv[2:]:
    name, method = case.split("/")
    module = models.build(CONFIGS[name])
    params = random_variables(module, scale=1.0)["params"]   # sharp logits: rows decode differently
    for mesh, (shape, devices) in MESHES.items():
        predictor = Predictor(module, params, Partitioner(shape, devices=jax.devices()[:devices]), method=method,
                              max_decode_length=8, num_beams=2)
        tokens, lengths, scores = predictor(inputs(module.config.arch))
        result[f"{case}/{mesh}"] = {"tokens": tokens.tolist(), "lengths": lengths.tolist(),
                                    "scores": scores.tolist(), "layout": query_layout(predictor.params)}
with open(sys.argv[1], "w") as f:
    json.dump(result, f)
