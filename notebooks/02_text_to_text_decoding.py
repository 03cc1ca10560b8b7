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
# # Text-to-text and decoding: greedy, beam search, sampling
#
# T5 casts every task as text in, text out. Its pre-training task is one too: the input is a
# sentence with spans replaced by sentinels, the output lists the missing spans. This notebook
# trains a tiny T5 (2+2 layers, d_model 128, 1.2M parameters) on that task for 200 steps with the
# `t5lite train` command, loads the checkpoint in Python, and decodes held-out sentences three
# ways:
#
# - **greedy**: the most probable token at each step;
# - **beam search**: the 4 best partial outputs kept at each step, so a token that looks worse now
#   but leads to a more probable whole output can win;
# - **sampling**: a token drawn from the (temperature-scaled) distribution at each step.
#
# The model is tiny and briefly trained, so its guesses are often wrong; what the notebook checks are
# the decoders' own properties. The text is the corpus every Python install carries; nothing is
# downloaded. Runs in about 1.5 CPU-minutes on a 2-core CPU, most of it training.

# %%
# %pip install -q "t5lite[notebooks]" --find-links .

# %%
import json
import os
import subprocess
import sys
import tempfile

import jax
import matplotlib.pyplot as plt
import numpy as np

from t5lite.data.tasks.pretraining import embedded_docs
from t5lite.data.corruption import denoise
from t5lite.infer import decoding, scoring
from t5lite.infer.predict import load_params, model_config_of, prompt_features
from t5lite.models import build

run_dir = os.path.join(tempfile.gettempdir(), "t5lite_notebook_t5_tiny")
# The Quickstart's recipe at 200 steps instead of 1000; run again, it finds its checkpoint and stops.
# Its console is captured (a kernel forwards a child's output slowly) and its summary lines shown.
training = subprocess.run([sys.executable, "-m", "t5lite.cli", "train", "--gin_file=configs/local/t5_tiny_pretrain.gin",
                           f"--gin.MODEL_DIR='{run_dir}'", "--gin.TRAIN_STEPS=200"], capture_output=True, text=True)
print("\n".join(line for line in (training.stderr + training.stdout).splitlines()
                if "trainable params" in line or "nothing to do" in line or line.startswith("final:")))
assert training.returncode == 0, training.stderr

# %%
with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    logged = [row for row in map(json.loads, f) if "loss" in row]
steps, losses = [row["step"] for row in logged], [row["loss"] for row in logged]
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(steps, losses)
ax.set_xlabel("step")
ax.set_ylabel("training loss (per target token)")
ax.set_title("t5_tiny, span corruption")
plt.show()
print(f"loss {losses[0]:.2f} at step {steps[0]}, {losses[-1]:.2f} at step {steps[-1]}")
assert losses[-1] < losses[0] - 2.5      # from about 8.3 (chance over 2100 ids is 7.65) to under 5

# %% [markdown]
# ## Held-out inputs
#
# The task's validation split (every 50th document of the corpus) was never trained on. The first
# 100 tokens of each document get T5's span corruption (15% noise, spans of mean length 3), as in
# training.

# %%
config = model_config_of(run_dir, None)
module = build(config)
params, step, _ = load_params(config, run_dir)
from t5lite.data.vocab import DEFAULT_VOCABULARY as vocabulary  # noqa: E402  (the one the run trained with)

held_out = [ex["text"] for ex in embedded_docs("validation")]
rng = np.random.default_rng(0)
rows, answers = [], []
for document in held_out[:8]:
    tokens = np.array(vocabulary.encode(document), np.int32)[:100]
    noise = denoise.random_spans_noise_mask(len(tokens), 0.15, rng)
    rows.append(denoise.noise_span_to_unique_sentinel(tokens, noise, vocabulary).tolist() + [1])   # + EOS
    answers.append(vocabulary.decode(denoise.nonnoise_span_to_unique_sentinel(tokens, noise, vocabulary).tolist()))
inputs = prompt_features(config, rows, max_length=128)
print(f"step {step} checkpoint; {len(rows)} inputs, e.g.\n  {vocabulary.decode(rows[0])}\n  answer: {answers[0]}")


# %%
def text(ids):
    """Decoded tokens up to EOS."""
    ids = [int(i) for i in ids]
    return vocabulary.decode(ids[:ids.index(1)] if 1 in ids else ids)


LENGTH = 32   # the training targets' length
greedy = decoding.greedy(module, params, inputs, max_decode_length=LENGTH)
beam = decoding.beam_search(module, params, inputs, max_decode_length=LENGTH, num_beams=4, alpha=0.0)
for i in range(3):
    print("input: ", vocabulary.decode(rows[i]))
    print("answer:", answers[i])
    print(f"greedy: {text(greedy.tokens[i])}   (log-prob {float(greedy.scores[i]):.2f})")
    print(f"beam 4: {text(beam.tokens[i, 0])}   (log-prob {float(beam.scores[i, 0]):.2f})")
    print()

# %% [markdown]
# Two properties to check:
#
# 1. A decoder's score is the model's log-probability of its output: scoring the output again
#    with a separate forward pass (`target_log_likelihood`, teacher forcing) gives the same number,
#    for greedy and for beam search (with no length penalty, `alpha=0`).
# 2. Sampling at temperature 0 is greedy decoding.
#
# Beam search is not guaranteed to find a more probable output than greedy: it keeps the 4 best
# *prefixes*, and the prefix greedy continues can drop out of them. The last line counts the inputs
# where beam search found greedy's own output, a more probable one and a less probable one. This
# briefly trained model has learned mostly "a sentinel, then `the` or `.`", then one sentinel again
# and again, so the two decoders' outputs are much alike.

# %%
rescored = scoring.target_log_likelihood(module, params, inputs, greedy.tokens)
np.testing.assert_allclose(rescored, greedy.scores, rtol=1e-4)
rescored = scoring.target_log_likelihood(module, params, inputs, beam.tokens[:, 0])
np.testing.assert_allclose(rescored, beam.scores[:, 0], rtol=1e-4)
cold = decoding.temperature_sample(module, params, inputs, jax.random.key(1), max_decode_length=LENGTH,
                                   temperature=0.0)
np.testing.assert_array_equal(cold.tokens[:, 0], greedy.tokens)
same = np.array([text(b) == text(g) for b, g in zip(beam.tokens[:, 0], greedy.tokens)])
better = ~same & (beam.scores[:, 0] > greedy.scores)
print(f"mean log-prob: greedy {float(greedy.scores.mean()):.2f}, beam {float(beam.scores[:, 0].mean()):.2f}; "
      f"of {len(rows)} inputs, beam search found greedy's output on {same.sum()}, a more probable one on "
      f"{better.sum()}, a less probable one on {(~same & ~better).sum()}")

# %% [markdown]
# ## Sampling and temperature
#
# Dividing the logits by a temperature below 1 sharpens the distribution (towards greedy); above 1
# flattens it. Eight samples per input at each temperature: at 0 all eight are greedy's output;
# hotter, they differ (for this model all eight already at 0.5), and each one is less probable.

# %%
temperatures = [0.0, 0.5, 1.0, 1.5]
distinct, mean_log_prob = [], []
for t in temperatures:
    out = decoding.temperature_sample(module, params, inputs, jax.random.key(2), max_decode_length=LENGTH,
                                      temperature=t, num_decodes=8)
    distinct.append(np.mean([len({text(s) for s in row}) for row in out.tokens]))
    mean_log_prob.append(float(scoring.target_log_likelihood(
        module, params, {k: np.repeat(v, 8, axis=0) for k, v in inputs.items()},
        out.tokens.reshape(-1, LENGTH)).mean()))
    print(f"temperature {t}: {distinct[-1]:.1f} distinct of 8, mean log-prob {mean_log_prob[-1]:.2f}; "
          f"e.g. {text(out.tokens[0, 0])!r}")
assert distinct[0] == 1                                         # temperature 0: always the argmax
assert all(a <= b for a, b in zip(distinct, distinct[1:]))      # hotter, more diverse
assert all(a >= b for a, b in zip(mean_log_prob, mean_log_prob[1:]))   # hotter, less probable

fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3))
left.plot(temperatures, distinct, "o-")
left.set_xlabel("temperature")
left.set_ylabel("distinct outputs of 8")
right.plot(temperatures, mean_log_prob, "o-", color="tab:red")
right.set_xlabel("temperature")
right.set_ylabel("mean log-probability")
fig.tight_layout()
plt.show()
