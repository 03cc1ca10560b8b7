# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Smaller and cheaper: int8 weights and magnitude pruning
#
# A trained model's weights carry more precision and more entries than its predictions need. Two
# ways to spend less on them:
#
# - **int8 weight-only quantisation**: each weight is stored as an 8-bit integer times one float
#   scale per output channel (the scale is the channel's largest |weight| / 127.5, so rounding moves
#   a weight by at most half a scale). Four times fewer bytes; the matmuls still run in float.
# - **Magnitude pruning**: the weights with the smallest |value| are set to zero. Done once, without
#   retraining, it shows how much of a network the loss can do without; iterated with retraining
#   (and rewinding) it is the lottery-ticket procedure of the compression guide.
#
# The notebook trains the tiny T5 of the decoding notebook (200 steps of span corruption; if that
# notebook ran, its checkpoint is reused), measures its held-out loss, quantises it with
# `t5lite convert --quantize int8`, and prunes it at growing sparsity, by magnitude and at random.
# Nothing is downloaded. Runs in about 1.5 CPU-minutes on a 2-core CPU, most of it training.

# %%
# %pip install -q "t5lite[notebooks]" --find-links .

# %%
import os
import subprocess
import sys
import tempfile

import jax
import matplotlib.pyplot as plt
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite.data.corruption import denoise
from t5lite.data.tasks.pretraining import embedded_docs
from t5lite.infer import scoring
from t5lite.infer.predict import load_params, model_config_of, padded_ids, prompt_features
from t5lite.models import build
from t5lite.train import pruning

run_dir = os.path.join(tempfile.gettempdir(), "t5lite_notebook_t5_tiny")
# The Quickstart's recipe at 200 steps; run again, it finds its checkpoint and stops.
training = subprocess.run([sys.executable, "-m", "t5lite.cli", "train", "--gin_file=configs/local/t5_tiny_pretrain.gin",
                           f"--gin.MODEL_DIR='{run_dir}'", "--gin.TRAIN_STEPS=200"], capture_output=True, text=True)
print("\n".join(line for line in (training.stderr + training.stdout).splitlines()
                if "trainable params" in line or "nothing to do" in line or line.startswith("final:")))
assert training.returncode == 0, training.stderr

# %% [markdown]
# ## The yardstick: held-out loss
#
# The documents of the task's validation split (every 50th document of the corpus, never trained
# on), each cut to 100 tokens and span-corrupted as in training. The score is the mean negative log-likelihood per target token
# (teacher forcing), the quantity training lowered.

# %%
config = model_config_of(run_dir, None)
module = build(config)
params, step, _ = load_params(config, run_dir)
from t5lite.data.vocab import DEFAULT_VOCABULARY as vocabulary  # noqa: E402  (the one the run trained with)

rng = np.random.default_rng(0)
inputs_rows, target_rows = [], []
for document in [ex["text"] for ex in embedded_docs("validation")]:
    tokens = np.array(vocabulary.encode(document), np.int32)[:100]
    noise = denoise.random_spans_noise_mask(len(tokens), 0.15, rng)
    inputs_rows.append(denoise.noise_span_to_unique_sentinel(tokens, noise, vocabulary).tolist() + [1])
    target_rows.append(denoise.nonnoise_span_to_unique_sentinel(tokens, noise, vocabulary).tolist()[:31] + [1])
inputs = prompt_features(config, inputs_rows, max_length=128)
targets, _ = padded_ids(target_rows, max_length=32)


def held_out_loss(module, params) -> float:
    """Mean negative log-likelihood per target token over the held-out documents."""
    log_probs = scoring.token_log_likelihoods(module, params, inputs, targets)
    return -float(np.sum(log_probs) / np.sum(targets != 0))


dense_loss = held_out_loss(module, params)
print(f"step {step}: held-out loss {dense_loss:.3f} per target token over {len(target_rows)} documents, "
      f"{int(np.sum(targets != 0))} target tokens")

# %% [markdown]
# ## int8 weights
#
# `t5lite convert --from_run RUN --quantize int8 --out OUT` writes a run whose dense kernels and
# embedding tables are int8 with a float32 scale per output channel; every command (eval, infer,
# fine-tuning) loads it like any run.

# %%
int8_dir = run_dir + "_int8"
if not os.path.exists(int8_dir):
    converted = subprocess.run([sys.executable, "-m", "t5lite.cli", "convert", f"--from_run={run_dir}",
                                "--quantize=int8", f"--out={int8_dir}"], capture_output=True, text=True)
    print(converted.stdout.strip().splitlines()[-1])
    assert converted.returncode == 0, converted.stderr
int8_config = model_config_of(int8_dir, None)
int8_module = build(int8_config)
int8_params, _, _ = load_params(int8_config, int8_dir)


def nbytes(tree) -> int:
    return sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(tree))


int8_loss = held_out_loss(int8_module, int8_params)
print(f"float32 weights {nbytes(params) / 1e6:.2f} MB, held-out loss {dense_loss:.4f}")
print(f"int8 weights    {nbytes(int8_params) / 1e6:.2f} MB, held-out loss {int8_loss:.4f} "
      f"({int8_loss - dense_loss:+.4f})")
assert nbytes(int8_params) < 0.3 * nbytes(params)        # 1 byte a weight instead of 4, plus the scales
assert abs(int8_loss - dense_loss) < 0.01 * dense_loss    # rounding each weight barely moves the loss

# %% [markdown]
# Check the rule on every quantised kernel: the int8 value times its channel's scale is the float
# weight rounded to the nearest multiple of the scale, so it is off by at most half a scale.

# %%
floats, stored = flatten_dict(params), flatten_dict(int8_params)
worst = 0.0
for path, q in stored.items():
    if np.asarray(q).dtype != np.int8:
        continue
    scale = np.asarray(stored[path[:-1] + (path[-1] + "_scale",)], np.float32)
    error = np.abs(np.asarray(q, np.float32) * scale - np.asarray(floats[path]))
    worst = max(worst, float(np.max(error / (scale / 2))))
print(f"{sum(np.asarray(q).dtype == np.int8 for q in stored.values())} int8 tensors; largest error "
      f"{worst:.4f} half-scales")
assert worst <= 1.0 + 1e-4

# %% [markdown]
# ## Magnitude pruning, once, without retraining
#
# `t5lite.train.pruning.magnitude_masks` ranks every dense kernel's weights together (global
# scope, as open_lth's `sparse_global`) and keeps the largest; embeddings, biases and norms are not
# pruned. The random control keeps the same share of each kernel's weights at random.

# %%
def random_masks(params, fraction: float, seed: int = 0) -> dict:
    """Each prunable weight kept with probability 1 - fraction; other leaves kept."""
    key = np.random.default_rng(seed)
    return unflatten_dict({p: key.random(np.shape(w)) >= fraction if pruning.prunable(p) else np.array(True)
                           for p, w in flatten_dict(jax.device_get(params)).items()})


fractions = [0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95]
by_magnitude, at_random = [dense_loss], [dense_loss]
for fraction in fractions[1:]:
    pruned = pruning.apply_masks(params, pruning.magnitude_masks(params, fraction=fraction))
    assert abs(pruning.sparsity(pruned)["total"] - fraction) < 0.01
    by_magnitude.append(held_out_loss(module, pruned))
    at_random.append(held_out_loss(module, pruning.apply_masks(params, random_masks(params, fraction))))
    print(f"{fraction:.0%} of kernel weights zeroed: held-out loss {by_magnitude[-1]:.3f} by magnitude, "
          f"{at_random[-1]:.3f} at random")

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot([100 * f for f in fractions], by_magnitude, "o-", label="smallest |weight| first")
ax.plot([100 * f for f in fractions], at_random, "s--", label="at random")
ax.set_xlabel("dense-kernel weights pruned (%)")
ax.set_ylabel("held-out loss per target token")
ax.legend()
fig.tight_layout()
plt.show()

assert by_magnitude[1] < 1.05 * dense_loss                      # a fifth of the weights cost almost nothing
assert all(m < r for m, r in zip(by_magnitude[2:], at_random[2:]))   # magnitude beats chance from 40% on
assert by_magnitude[-1] > by_magnitude[1]                       # and the loss does grow as more go

# %% [markdown]
# What it shows: small weights matter little, so the first fifth of them goes almost for free, and
# choosing by magnitude beats choosing at random, by a little up to 40% and by far beyond. Zeros only
# save time or memory with sparse kernels or structured pruning (whole heads, see the compression
# guide's head pruning); int8 saves memory at once, and time where decoding is limited by memory
# bandwidth (accelerators), not on this CPU, where XLA converts the int8 weights to float32 inside
# each matmul.
