"""XLM's translation language model (TLM, Conneau & Lample 2019) as input corruption: a sentence and
its translation concatenated into one stream, positions restarting at the translation, a language
id per token (`token_type_ids`, which the model embeds as XLM embeds its languages), and XLM's
masking over both sides, so a masked word may be predicted from the other language's context.

Laid out as facebookresearch/XLM builds a TLM batch (`xlm/utils.py` `concat_batches` with
`reset_positions=True`, after `Dataset.batch_sentences` puts `</s>` around each sentence; t5lite's
EOS stands for `</s>`) and masked as its `Trainer.mask_out`: every token but the first chosen with
probability `word_pred`, each chosen one then [MASK], kept or random with `mask_keep_rand`.
Feature converter "encoder_positions", no packing; objective `MlmObjective`.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Sequence

import gin
import numpy as np

from t5lite.data.corruption.masking import random_pool, special_ids

Example = dict[str, Any]


def concatenate_pair(first: np.ndarray, second: np.ndarray, eos_id: int, max_length: int) -> Example:
    """`</s> first </s> </s> second </s>` with positions 0.. restarting at the second `</s> ...` and
    language ids 0 then 1; each sentence cut to an equal share of `max_length` first."""
    budget = max(1, max_length // 2 - 2)
    halves = [np.array([eos_id, *sentence[:budget], eos_id], np.int32) for sentence in (first, second)]
    return {"inputs": np.concatenate(halves), "targets": np.concatenate(halves),
            "positions": np.concatenate([np.arange(len(h), dtype=np.int32) for h in halves]),
            "token_type_ids": np.concatenate([np.full(len(h), language, np.int32) for language, h in enumerate(halves)])}


def tlm_pairs(dataset: Iterable[Example], sequence_length: Mapping[str, int], output_features: Mapping[str, Any],
              languages: Sequence[str] = ("en", "de")) -> Iterator[Example]:
    """Parallel examples `{"en": text, "de": text}` as TLM streams of the two `languages` in order
    (`concatenate_pair`); a pair with an empty side is dropped."""
    vocabulary = output_features["inputs"].vocabulary
    for ex in dataset:
        first, second = (np.asarray(vocabulary.encode(ex[language]), np.int32) for language in languages)
        if len(first) and len(second):
            yield concatenate_pair(first, second, vocabulary.eos_id, int(sequence_length["inputs"]))


def xlm_mask(tokens: np.ndarray, rng: np.random.Generator, mask_id: int, pool: np.ndarray, word_pred: float = 0.15,
             mask_keep_rand: Sequence[float] = (0.8, 0.1, 0.1)) -> tuple[np.ndarray, np.ndarray]:
    """XLM's `mask_out` on one stream, drawing in its order: a uniform per token (chosen when <=
    `word_pred`; never the first token nor padding), a random id from `pool` per chosen token, then
    per chosen token [MASK] / kept / random with the `mask_keep_rand` probabilities. Returns the
    corrupted inputs and the chosen positions (1 where a token is predicted)."""
    chosen = rng.random(len(tokens)) <= word_pred
    chosen[0] = False
    chosen &= tokens != 0
    real = tokens[chosen]
    random = pool[rng.integers(len(pool), size=len(real))]
    how = rng.choice(3, size=len(real), p=np.asarray(mask_keep_rand, np.float64))
    inputs = tokens.copy()
    inputs[chosen] = np.select([how == 0, how == 1], [mask_id, real], random)
    return inputs, chosen.astype(np.int32)


@gin.configurable(denylist=["dataset", "output_features", "seed"])
def translation_lm_mask(dataset: Iterable[Example], output_features: Mapping[str, Any], seed: int,
                        word_pred: float = 0.15, mask_keep_rand: Sequence[float] = (0.8, 0.1, 0.1),
                        random_from: str = "non_special") -> Iterator[Example]:
    """`xlm_mask` on every stream `tlm_pairs` made (a new mask per epoch, as the loader reseeds);
    `random_from` as in `masking.random_pool` ("vocabulary": XLM's draw over every id)."""
    vocabulary = output_features["inputs"].vocabulary
    pool, mask_id = random_pool(vocabulary, random_from), special_ids(vocabulary)["mask"]
    for i, ex in enumerate(dataset):
        rng = np.random.default_rng([seed, 5, i])
        inputs, chosen = xlm_mask(np.asarray(ex["targets"], np.int32), rng, mask_id, pool, word_pred, mask_keep_rand)
        yield {**ex, "inputs": inputs, "targets_loss_weights": chosen}
