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
# # Contextual embeddings and BERTology: ELMo, probes, attention heads
#
# A static word vector gives "play" one vector whatever the sentence; a contextual model gives each
# occurrence its own. This notebook looks inside two pre-trained models, frozen throughout:
#
# - **ELMo** (Peters et al. 2018): a character CNN (layer 0, one vector per spelling: static) under
#   a forward and a backward LSTM language model (layers 1 and 2: contextual). Its occurrences of
#   "play" as a verb and as a noun, and a **linear part-of-speech probe** per layer (softmax
#   regression on frozen vectors: what a layer makes linearly readable).
# - **a tiny BERT** (`bert_tiny`, 2 layers of 64, pre-trained by masked language modelling for 1000
#   steps on Python's documentation, the fine-tuning notebook's base): the same probe per layer
#   with `t5lite probe`, against the same model untrained (the control), and its attention heads
#   with `t5lite attention` (Clark et al. 2019, "What does BERT look at?").
#
# The words and tags are Universal Dependencies English-EWT, read from `data/ud` (or the folder in
# the `UD` environment variable) and downloaded there when missing, as the data guide does. The
# ELMo weights are read from `models/elmo` (or the files in `ELMO_OPTIONS` and `ELMO_WEIGHTS`) and
# downloaded there when missing: the released model (93.6M parameters, 357 MB). The run time below
# is measured with allennlp's small test biLM of the same architecture (LSTMs of 64 cells
# projected to 16); the released model is slower. With the small biLM, about 3 CPU-minutes on a
# 2-core CPU, most of it the base's pre-training,
# which it skips when the fine-tuning notebook has left the base there.

# %%
# %pip install -q "t5lite[notebooks]" --find-links .

# %%
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, display

from t5lite.analysis import linear, words
from t5lite.interop import elmo

ud_dir = os.environ.get("UD", "data/ud")
ewt = os.path.join(ud_dir, "en_ewt")
os.makedirs(ewt, exist_ok=True)
for split in ("train", "dev", "test"):   # the data guide's download
    path = os.path.join(ewt, f"en_ewt-ud-{split}.conllu")
    if not os.path.exists(path):
        urllib.request.urlretrieve("https://raw.githubusercontent.com/UniversalDependencies/UD_English-EWT/master/"
                                   f"en_ewt-ud-{split}.conllu", path)
options = os.environ.get("ELMO_OPTIONS", "models/elmo/options.json")
weights = os.environ.get("ELMO_WEIGHTS", "models/elmo/weights.hdf5")
release = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/2x4096_512_2048cnn_2xhighway/"
for path, name in ((options, "options.json"), (weights, "weights.hdf5")):
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        urllib.request.urlretrieve(release + "elmo_2x4096_512_2048cnn_2xhighway_" + name, path)
module, variables = elmo.load(options, weights)

train = words.read_conll(os.path.join(ewt, "en_ewt-ud-train.conllu"), 500)
test = words.read_conll(os.path.join(ewt, "en_ewt-ud-test.conllu"), 200)
tags = sorted({t for s in train + test for t in s.tags})
print(f"{len(train)} training and {len(test)} test sentences, {len(tags)} UPOS tags")

# %% [markdown]
# ## "play", static and contextual
#
# Every sentence of EWT with the word "play" as a verb or as a noun, embedded by ELMo (each sentence
# from zero LSTM states, so its vectors depend on the sentence alone). Layer 0 sees only the
# characters of "play": all its occurrences get one vector. Layers 1 and 2 give each occurrence
# its own.

# %%
everything = [s for split in ("train", "dev", "test")
              for s in words.read_conll(os.path.join(ewt, f"en_ewt-ud-{split}.conllu"))]
found = [(s, i) for s in everything for i, w in enumerate(s.words) if w == "play" and s.tags[i] in ("VERB", "NOUN")]
is_verb = np.array([s.tags[i] == "VERB" for s, i in found])
layers = elmo.embed(module, variables, [list(s.words) for s, _ in found])
play = [np.stack([x[k, i] for x, (_, i) in zip(layers, found)]) for k in range(3)]   # per layer [occurrences, d]
print(f'"play": {is_verb.sum()} verbs, {(~is_verb).sum()} nouns, e.g.')
for want in (True, False):
    s, i = found[int(np.argmax(is_verb == want))]
    print("  ", " ".join(w.upper() if j == i else w for j, w in enumerate(s.words)))

np.testing.assert_allclose(play[0], np.broadcast_to(play[0][0], play[0].shape), atol=1e-6)   # static
unit = [v / np.linalg.norm(v, axis=1, keepdims=True) for v in play]
cosines = [u @ u.T for u in unit]
for k in (1, 2):
    assert cosines[k].min() < 0.99      # contextual: occurrences differ
    print(f"layer {k}: cosines between occurrences from {cosines[k].min():.2f} to "
          f"{np.sort(cosines[k], axis=None)[-len(found) - 1]:.2f}")

# %% [markdown]
# Does an occurrence's nearest other occurrence share its sense? Layer 0 cannot tell them apart
# (every occurrence is every other's nearest); for the contextual layers, the share of occurrences
# whose nearest neighbour (by cosine) has the same part of speech, against the share expected
# by chance (a random other occurrence).

# %%
chance = (is_verb.mean() ** 2 + (1 - is_verb.mean()) ** 2)
same_sense = {}
for k in (1, 2):
    c = cosines[k] - 2 * np.eye(len(found))          # never one's own neighbour
    same_sense[k] = float(np.mean(is_verb[c.argmax(1)] == is_verb))
    print(f"layer {k}: nearest occurrence has the same part of speech for {same_sense[k]:.2f} "
          f"(chance {chance:.2f})")

# %% [markdown]
# ## A part-of-speech probe per ELMo layer
#
# Softmax regression (`t5lite.analysis.linear`: L-BFGS to convergence, L2 1e-3, the same probe
# `t5lite probe` trains) on each layer's word vectors of the first 500 EWT training sentences,
# scored on the first 200 test sentences. The yardstick is the majority tag (NOUN).

# %%
index = {t: i for i, t in enumerate(tags)}
y_train = np.array([index[t] for s in train for t in s.tags])
y_test = np.array([index[t] for s in test for t in s.tags])
majority_tag = np.bincount(y_train).argmax()
majority_rate = float(np.mean(y_test == majority_tag))
train_layers = elmo.embed(module, variables, [list(s.words) for s in train])
test_layers = elmo.embed(module, variables, [list(s.words) for s in test])
elmo_accuracy, play_tags = [], []
for k in range(3):
    probe = linear.fit(np.concatenate([x[k] for x in train_layers]), y_train, len(tags))
    predicted = linear.predict_proba(probe, np.concatenate([x[k] for x in test_layers])).argmax(-1)
    elmo_accuracy.append(float(np.mean(predicted == y_test)))
    play_tags.append([tags[t] for t in linear.predict_proba(probe, play[k]).argmax(-1)])
    print(f"layer {k}: POS accuracy {elmo_accuracy[k]:.3f}; on the {len(found)} plays it says "
          f"{ {t: play_tags[k].count(t) for t in sorted(set(play_tags[k]))} }")
print(f"majority tag {tags[majority_tag]}: {majority_rate:.3f}")
assert min(elmo_accuracy) > majority_rate + 0.2
assert len(set(play_tags[0])) == 1      # a static vector gets one tag, whatever the sentence

# %% [markdown]
# With the small test biLM (a fixture trained on little text), the character layer is the best
# probe and the LSTM layers separate the senses of "play" only somewhat better than chance; Peters
# et al. (Tables 5 and 6) report for the released model that the first LSTM layer is the best for
# part of speech and the second for word senses. Set `ELMO_OPTIONS` and `ELMO_WEIGHTS` (or remove
# them, to download the released model) and run the notebook again to compare.

# %% [markdown]
# ## The tiny BERT: probes against an untrained control, and its attention heads
#
# `t5lite probe` runs the same probe on each layer of a Transformer run (layer 0: the embeddings;
# each word is its first subword), and on the same architecture freshly initialised: the control
# shows what the probe reads from word identities alone. `t5lite attention` measures, per head,
# where attention goes (`[CLS]`, `[SEP]`, the next or previous token, punctuation) and, per
# dependency relation, how often the head's most-attended word is the word's syntactic head,
# against the best fixed offset ("the next word").

# %%
work = tempfile.gettempdir()
base_dir = os.path.join(work, "t5lite_notebook_bert_tiny_mlm")   # the fine-tuning notebook's base


def t5lite(*args):
    """One t5lite command, its console captured (a kernel forwards a child's output slowly)."""
    run = subprocess.run([sys.executable, "-m", "t5lite.cli", *args], capture_output=True, text=True)
    print("\n".join((run.stderr + run.stdout).splitlines()[-2:]))
    assert run.returncode == 0, run.stderr


# Run again, it finds its checkpoint and stops.
t5lite("train", "--gin_file=gin/train.gin", "--gin_file=gin/optimizers/adamw.gin",
       "--gin_file=gin/objectives/bert_mlm.gin", "--gin_file=gin/partitioning/data_parallel.gin",
       f"--gin.MODEL_DIR='{base_dir}'", "--gin.TRAIN_STEPS=1000", "--gin.BATCH_SIZE=32",
       "--gin.TASK_FEATURE_LENGTHS={'inputs': 64}", "--gin.model_config.preset='bert_tiny'",
       "--gin.model_config.vocab_size=2176")
out = os.path.join(work, "t5lite_notebook_bertology")
t5lite("probe", "--model", base_dir, "--name", "bert_tiny", "--data_dir", ud_dir, "--probes", "pos", "--out", out)
t5lite("attention", "--model", base_dir, "--name", "bert_tiny", "--data_dir", ud_dir, "--out", out)
with open(os.path.join(out, "probe.json")) as f:
    probed = json.load(f)
bert_accuracy = probed["pos"]["bert_tiny"]["accuracy"]
control_accuracy = probed["pos"]["bert_tiny (untrained)"]["accuracy"]
print("bert_tiny POS accuracy per layer:", [round(a, 3) for a in bert_accuracy],
      "; untrained:", [round(a, 3) for a in control_accuracy])
assert all(a > c + 0.03 for a, c in zip(bert_accuracy, control_accuracy))
assert min(bert_accuracy) > majority_rate + 0.2

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.2))
ax.plot(range(3), elmo_accuracy, "o-", label="ELMo (small test biLM)" if "lm_weights" in weights else "ELMo")
ax.plot(range(len(bert_accuracy)), bert_accuracy, "s-", label="bert_tiny, MLM 1000 steps")
ax.plot(range(len(control_accuracy)), control_accuracy, "s--", color="tab:orange", alpha=0.5,
        label="bert_tiny untrained (control)")
ax.axhline(majority_rate, color="grey", linestyle=":", label="majority tag")
ax.set_xticks(range(3))
ax.set_xlabel("layer (0 = token embeddings)")
ax.set_ylabel("UPOS accuracy, EWT test")
ax.set_ylim(0, 1)
ax.legend(fontsize=8)
ax.set_title("Linear POS probes per layer")
fig.tight_layout()
plt.show()

# %% [markdown]
# The heads: where each one's attention goes, averaged over the query tokens of the first 200 EWT
# dev sentences (those that fit the model's 64 positions), and for a few dependency relations the head that finds the most syntactic heads.
# Clark et al. found heads of BERT-base that beat the fixed-offset baseline on several relations;
# this model is 300 times smaller and briefly trained, and none of its heads comes near "the next
# word" for determiners and adjectives.

# %%
with open(os.path.join(out, "attention.json")) as f:
    attention = json.load(f)
print("head  [CLS]  [SEP]  next   prev   punct  entropy")
for name, row in attention["heads"].items():
    print(f"{name:5s} {row['cls']:.3f}  {row['sep']:.3f}  {row['next']:.3f}  {row['previous']:.3f}  "
          f"{row['punctuation']:.3f}  {row['entropy']:.2f}")
for relation in ("det", "amod", "nsubj", "obj"):
    best = attention["relations"][relation]
    print(f"{relation:6s} best head {best['head']} ({best['direction']}) {best['accuracy']:.2f}; "
          f"offset {best['baseline_offset']:+d} {best['baseline_accuracy']:.2f}")
for relation in ("det", "amod"):
    assert attention["relations"][relation]["baseline_accuracy"] > attention["relations"][relation]["accuracy"] + 0.2

display(Image(filename=os.path.join(out, "attention_heads.png")))   # the figure `t5lite attention` wrote
