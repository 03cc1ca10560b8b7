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
# # Pre-training objectives on real text
#
# Four ways to turn unlabelled text into a prediction task, each applied by t5lite's own data-side
# functions (the ones its training runs use) to real English sentences:
#
# 1. **T5 span corruption**: 15% of the tokens, in spans of mean length 3, each span replaced by a
#    sentinel; the target lists the spans.
# 2. **BERT masked LM**: 15% of the tokens chosen; of those 80% become `[MASK]`, 10% a random
#    token, 10% stay as they are.
# 3. **BART noise**: the sentences shuffled, then text infilling: Poisson-length spans, each
#    replaced by a single `[MASK]` (so the model must also guess how long each gap is).
# 4. **ELECTRA replaced-token detection**: a generator fills masked positions with plausible
#    tokens; the discriminator labels every token "original" or "replaced".
#
# Each section prints an example and then checks the objective's published statistics over a
# few thousand samples, with tolerances of four binomial (or Poisson) standard deviations.
#
# The text is the corpus every Python install carries (the language reference and the standard
# library's docstrings); the vocabulary is t5lite's 2000-piece SentencePiece model trained on it
# (trained and cached on first use, about a minute). Nothing is downloaded. Runs in about a
# minute on a 2-core CPU.

# %%
# %pip install -q "t5lite[notebooks]" --find-links .

# %%
import collections

import matplotlib.pyplot as plt
import numpy as np

from t5lite.data.corpus import embedded_documents
from t5lite.data.corruption import bart_noise, denoise, masking
from t5lite.data.registry import Feature
from t5lite.data.vocab import make_vocabulary

vocabulary = make_vocabulary()             # SentencePiece, 2000 pieces + 100 sentinels
features = {"inputs": Feature(vocabulary), "targets": Feature(vocabulary)}
documents = embedded_documents()
mask_id = masking.special_ids(vocabulary)["mask"]   # <extra_id_0>: this vocabulary has no [MASK] of its own


def show(ids):
    """The tokens as text, with the mask token written [MASK]."""
    return vocabulary.decode([int(i) for i in ids]).replace(vocabulary.decode([mask_id]).strip(), "[MASK]")


sentence = next(line for d in documents for line in d.split(". ") if line.startswith("Next, for each keyword"))
tokens = np.array(vocabulary.encode(sentence), np.int32)
print(f"{len(documents)} documents; vocabulary of {vocabulary.vocab_size} ids")
print(sentence)
print(len(tokens), "tokens:", [vocabulary.id_to_piece(int(t)) for t in tokens])

# %%
# The corpus as token sequences of 40 to 400 tokens, for the statistics.
corpus = [np.array(vocabulary.encode(d), np.int32) for d in documents]
corpus = [t for t in corpus if 40 <= len(t) <= 400]
total_tokens = sum(len(t) for t in corpus)
print(f"{len(corpus)} sequences, {total_tokens} tokens")

# %% [markdown]
# ## 1. T5 span corruption
#
# `random_spans_noise_mask` marks exactly round(0.15 x length) tokens as noise, cut into
# round(noise / 3) spans; `noise_span_to_unique_sentinel` replaces each span in the inputs by its
# own sentinel (`<extra_id_0>`, `<extra_id_1>`, ...) and `nonnoise_span_to_unique_sentinel` makes
# the target: each sentinel followed by the tokens it hides.

# %%
rng = np.random.default_rng(0)
mask = denoise.random_spans_noise_mask(len(tokens), 0.15, rng)
inputs = denoise.noise_span_to_unique_sentinel(tokens, mask, vocabulary)
targets = denoise.nonnoise_span_to_unique_sentinel(tokens, mask, vocabulary)
print("inputs: ", vocabulary.decode(inputs.tolist()))
print("targets:", vocabulary.decode(targets.tolist()))


# %%
def fill_in(inputs, targets):
    """Undoes span corruption: each sentinel of the inputs replaced by what follows it in the targets."""
    first_sentinel = vocabulary.vocab_size - vocabulary.extra_ids
    answers, current = {}, None
    for t in targets:
        if t >= first_sentinel:
            current = answers.setdefault(int(t), [])
        else:
            current.append(int(t))
    return [x for t in inputs for x in (answers[int(t)] if t >= first_sentinel else [int(t)])]


assert fill_in(inputs, targets) == tokens.tolist()   # inputs + targets hold the sentence exactly

span_lengths, noise_fraction = [], []
for seq in corpus:
    m = denoise.random_spans_noise_mask(len(seq), 0.15, rng)
    starts = np.flatnonzero(m & ~np.concatenate([[False], m[:-1]]))
    ends = np.flatnonzero(m & ~np.concatenate([m[1:], [False]]))
    span_lengths.extend(ends - starts + 1)
    noise_fraction.append(m.mean())
span_lengths = np.array(span_lengths)
print(f"noise fraction {np.mean(noise_fraction):.4f}, mean span length {span_lengths.mean():.3f} "
      f"over {len(span_lengths)} spans")
assert abs(np.mean(noise_fraction) - 0.15) < 0.005           # exactly round(0.15 x length) per sequence
assert abs(span_lengths.mean() - 3.0) < 0.1                  # noise / round(noise / 3) per sequence

# %% [markdown]
# ## 2. BERT's masked LM: 80/10/10
#
# `bert_mlm` chooses round(0.15 x length) tokens (whole words, as BERT's whole-word-masking
# models), then corrupts each chosen token: `[MASK]` with probability 0.8, else a random token with
# probability 0.5, else unchanged. The loss is taken on the chosen positions only
# (`targets_loss_weights`).

# %%
first = next(masking.bert_mlm([{"inputs": tokens}], features, seed=1))
chosen = first["targets_loss_weights"] == 1
print("original: ", show(first["targets"]))
print("corrupted:", show(first["inputs"]))
print("chosen:   ", [vocabulary.id_to_piece(int(t)) for t in first["targets"][chosen]])

examples = list(masking.bert_mlm(({"inputs": t} for t in corpus), features, seed=0))
outcome = collections.Counter()
chosen_fraction = []
for ex in examples:
    at = ex["targets_loss_weights"] == 1
    chosen_fraction.append(at.mean())
    corrupted, original = ex["inputs"][at], ex["targets"][at]
    outcome["[MASK]"] += int(np.sum(corrupted == mask_id))
    outcome["random"] += int(np.sum((corrupted != mask_id) & (corrupted != original)))
    outcome["kept"] += int(np.sum(corrupted == original))
n = sum(outcome.values())
observed = {k: v / n for k, v in outcome.items()}
print(f"chosen: {np.mean(chosen_fraction):.4f} of the tokens; of {n} chosen tokens:",
      {k: round(v, 4) for k, v in observed.items()})

# %%
# A random token equal to the original reads as kept: 0.1 x 1/|pool| of the chosen tokens move over.
pool = len(masking.random_pool(vocabulary))
expected = {"[MASK]": 0.8, "random": 0.1 * (1 - 1 / pool), "kept": 0.1 + 0.1 / pool}
for name, p in expected.items():
    sd = np.sqrt(p * (1 - p) / n)
    assert abs(observed[name] - p) < 4 * sd, (name, observed[name], p, sd)
assert abs(np.mean(chosen_fraction) - 0.15) < 0.01   # whole words may fall a piece short of 15%

fig, ax = plt.subplots(figsize=(5, 3))
names = list(expected)
ax.bar(names, [observed[k] for k in names], color="tab:blue", label="observed")
ax.scatter(names, [expected[k] for k in names], color="black", zorder=3, label="BERT's 80/10/10")
ax.set_ylabel("share of the chosen tokens")
ax.set_title(f"bert_mlm on {n} chosen tokens")
ax.legend()
plt.show()

# %% [markdown]
# ## 3. BART: sentence permutation and text infilling
#
# `bart_denoise` applies BART's published pre-training noise (fairseq's `DenoisingDataset` with
# `--mask 0.3 --mask-length span-poisson --poisson-lambda 3.5 --permute-sentences 1`): the
# sentences are shuffled, then spans of whole words, 30% of the words in all, each collapse into
# one `[MASK]`. The target is the original text.

# %%
paragraph = next(d for d in documents if d.count(". ") >= 3 and len(d) < 600)
example = next(bart_noise.bart_denoise([{"targets": np.array(vocabulary.encode(paragraph), np.int32)}],
                                       features, seed=2))
print("original:", vocabulary.decode(example["targets"].tolist()))
print()
print("noised:  ", show(example["inputs"]))

# %% [markdown]
# Sentence permutation alone only reorders: the tokens are the same multiset. Text infilling with
# the paper's description (`text_infilling`: Poisson(3) span lengths) removes exactly
# round(0.3 x length) tokens and puts one `[MASK]` per span; the span lengths, zero included, are
# Poisson(3).

# %%
ends = bart_noise.sentence_ends(example["targets"], vocabulary)
permuted = bart_noise.sentence_permutation(example["targets"], ends, 1.0, rng)
assert sorted(permuted.tolist()) == sorted(example["targets"].tolist())

lengths = []
for seq in corpus:
    infilled = bart_noise.text_infilling(seq, 0.3, mask_id, rng)
    spans = int(np.sum(infilled == mask_id))
    assert len(infilled) == len(seq) - round(0.3 * len(seq)) + spans
    lengths.extend(bart_noise.poisson_span_lengths(1000, 3.0, rng)[:-1])   # the last one is cut to fit
lengths = np.array(lengths)
print(f"{len(lengths)} span lengths: mean {lengths.mean():.3f}, variance {lengths.var():.3f}")
assert abs(lengths.mean() - 3.0) < 4 * np.sqrt(3.0 / len(lengths))

from math import exp, factorial  # noqa: E402  (the Poisson pmf for the plot)

ks = np.arange(0, 12)
fig, ax = plt.subplots(figsize=(5, 3))
ax.bar(ks, [np.mean(lengths == k) for k in ks], color="tab:orange", label="BART spans")
ax.plot(ks, [exp(-3) * 3 ** k / factorial(k) for k in ks], "k.-", label="Poisson(3)")
ax.hist(span_lengths, bins=np.arange(0.5, 12.5), density=True, histtype="step", color="tab:blue",
        label="T5 spans (mean 3)")
ax.set_xlabel("span length (tokens)")
ax.set_ylabel("share of spans")
ax.legend()
plt.show()

# %% [markdown]
# ## 4. ELECTRA: replaced-token detection
#
# `electra_mlm` masks about 15% of the positions (ELECTRA masks 85% of its draws and keeps the
# rest); a small generator then samples a token at each drawn position, and the discriminator
# learns to tell which tokens were replaced. Here the generator is a stand-in: a unigram model of
# the corpus, sampled as `ElectraObjective` samples its generator (`sample_replacements`). A sample
# that happens to equal the original counts as **original**, as in ELECTRA.

# %%
import jax  # noqa: E402

from t5lite.objectives.electra import sample_replacements  # noqa: E402

counts = np.bincount(np.concatenate(corpus), minlength=vocabulary.vocab_size).astype(np.float32)
unigram_logits = np.log(counts + 1e-3)
seq = tokens
drawn = next(masking.electra_mlm([{"inputs": seq}], features, {"inputs": 512}, seed=0))
positions = drawn["targets_loss_weights"] > 0
samples = np.asarray(sample_replacements(jax.numpy.tile(unigram_logits, (len(seq), 1)), jax.random.PRNGKey(0),
                                         pad_id=0))
corrupted = np.where(positions, samples, seq)
replaced = corrupted != seq
print("generator input:", show(drawn["inputs"]))
print("corrupted:      ", show(corrupted))
print("replaced:       ", [vocabulary.id_to_piece(int(t)) + " -> " + vocabulary.id_to_piece(int(r))
                           for t, r in zip(seq[replaced], corrupted[replaced])])
assert not replaced[~positions].any()                 # only drawn positions can be replaced

# %% [markdown]
# Over the corpus: round(0.15 x length) draws per sequence, of which 85% are masked; positions drawn
# twice make the drawn share a little under 15%.

# %%
draws = masked = drawn_positions = 0
for ex in masking.electra_mlm(({"inputs": t} for t in corpus), features, {"inputs": 512}, seed=0):
    draws += int(ex["targets_loss_weights"].sum())
    drawn_positions += int(np.sum(ex["targets_loss_weights"] > 0))
    masked += int(np.sum(ex["inputs"] == mask_id))
print(f"{draws / total_tokens:.4f} of the tokens drawn, {masked / drawn_positions:.4f} of the drawn positions masked")
assert abs(draws / total_tokens - 0.15) < 0.005
# A position drawn twice is masked unless both draws kept it: slightly above 0.85.
assert 0.85 - 4 * np.sqrt(0.85 * 0.15 / drawn_positions) < masked / drawn_positions < 0.87
