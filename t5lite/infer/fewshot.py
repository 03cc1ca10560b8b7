"""Few-shot in-context evaluation (GPT-3, Brown et al. 2020) of a decoder-only model on a task.

Each query is preceded by `k` solved examples (demonstrations) drawn from the task's train split,
seeded per query and never the query itself, each written `input -> target` and joined by a
separator:

    sst2 sentence: a gem -> positive
    sst2 sentence: dull and long -> negative
    sst2 sentence: <the query> ->

The model then answers in two ways, each scored by the task's postprocessor and metrics:
rank classification (the label string whose tokens, as the continuation of the prompt, are most
likely; metrics prefixed `score_`) and free generation (greedy, cut at the separator or EOS).
A prompt longer than the model's budget loses its start: the query stays whole.

    t5lite eval ... --gin.eval.fewshot=@FewShot() --gin.FewShot.k=4
"""
from __future__ import annotations

import itertools
import logging
from typing import Sequence

import gin
import numpy as np

from t5lite import finite, metrics as metrics_lib
from t5lite.errors import ConfigError, DataError
from t5lite.infer import decoding, evaluation, predict

log = logging.getLogger("t5lite")

ANSWER_MARK = " ->"
WIDTH_MULTIPLE = 64   # prompts are padded to the longest one, rounded up to this


def format_prompt(demonstrations: Sequence[tuple[str, str]], query: str, separator: str) -> str:
    """`input -> target` for each demonstration, then `query ->`, joined by `separator`."""
    return separator.join([f"{x}{ANSWER_MARK} {y}" for x, y in demonstrations] + [f"{query}{ANSWER_MARK}"])


def draw_demonstrations(pool_size: int, excluded: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
    """`k` distinct indices below `pool_size` in random order, none of them `excluded` (the train
    examples whose input is the query's, so evaluating on the train split never shows the answer)."""
    if k > pool_size - len(excluded):
        raise DataError(f"FewShot.k={k} demonstrations requested but the train split has only "
                        f"{pool_size - len(excluded)} examples other than the query; lower k")
    drawn = rng.choice(pool_size, size=k + len(excluded), replace=False)
    return [int(i) for i in drawn if i not in excluded][:k]


def cut_generation(text: str, separator: str) -> str:
    """A generated answer up to the separator (or a newline), stripped."""
    for mark in (separator.strip() or separator, "\n"):
        text = text.split(mark)[0] if mark else text
    return text.strip()


@gin.configurable
class FewShot:
    """How queries are prompted: `k` demonstrations (0: zero-shot) joined by `separator`, drawn
    with `seed`; prompt plus answer fit in `max_length` tokens (None: the model's positions, or
    1024 for relative ones)."""

    def __init__(self, k: int = 0, separator: str = "\n", seed: int = 0, max_length: int | None = None,
                 train_split: str = "train"):
        if k < 0:
            raise ConfigError(f"FewShot.k={k}: the number of demonstrations must be 0 (zero-shot) or more")
        self.k, self.separator, self.seed, self.max_length, self.train_split = k, separator, seed, max_length, \
            train_split

    def __repr__(self):
        return f"FewShot(k={self.k}, separator={self.separator!r}, seed={self.seed}, max_length={self.max_length})"

    def prompts(self, queries: Sequence[str], pool: Sequence[tuple[str, str]]) -> list[str]:
        """One prompt per query; query `i`'s demonstrations depend only on (seed, i)."""
        same_input: dict[str, list[int]] = {}
        for j, (x, _) in enumerate(pool):
            same_input.setdefault(x, []).append(j)
        out = []
        for i, query in enumerate(queries):
            rng = np.random.default_rng([self.seed, i])
            drawn = draw_demonstrations(len(pool), same_input.get(query, []), self.k, rng) if self.k else []
            out.append(format_prompt([pool[j] for j in drawn], query, self.separator))
        return out

    def evaluate(self, task, split: str, module, params, *, data_dir: str | None = None,
                 max_examples: int | None = None, batch_size: int = 16) -> evaluation.EvalResult:
        """The task's metrics on `split` by rank classification (`score_*`) and free generation."""
        config = module.config
        if config.arch != "decoder":
            raise ConfigError(f"few-shot evaluation prompts a decoder-only model; this one is {config.arch}")
        vocabulary = task.output_features["inputs"].vocabulary
        examples = list(itertools.islice(task.get_dataset(split, data_dir=data_dir), max_examples))
        if not examples:
            raise DataError(f"task {task.name!r} has no examples in split {split!r} (data_dir={data_dir!r})")
        texts = lambda ex: (ex["inputs_pretokenized"], ex["targets_pretokenized"])
        pool = [texts(ex) for ex in task.get_dataset(self.train_split, data_dir=data_dir)] if self.k else []
        labels = evaluation.label_strings(task, examples)
        if not labels:
            raise DataError(f"task {task.name!r} has no fixed label strings to rank; few-shot evaluation needs a "
                            "classification task")
        # Labels are continuations: no EOS, a word of their own after the prompt's " ->".
        label_tokens, label_lengths = evaluation.padded_rows([vocabulary.encode(" " + y) for y in labels],
                                                             max(len(vocabulary.encode(" " + y)) for y in labels))
        answer_length = int(label_lengths.max()) + 1   # one more: does the generation end after the label?
        budget = self._prompt_budget(config, answer_length)
        prompts = self.prompts([texts(ex)[0] for ex in examples], pool)
        prompt_ids = [vocabulary.encode(p) for p in prompts]
        truncated = sum(len(ids) > budget for ids in prompt_ids)
        if truncated:
            log.info("%d of %d prompts longer than %d tokens lose their start", truncated, len(prompts), budget)
        kept = [ids[max(0, len(ids) - budget):] for ids in prompt_ids]
        width = min(budget, -(-max(map(len, kept)) // WIDTH_MULTIPLE) * WIDTH_MULTIPLE)   # one compiled shape
        tokens, lengths = evaluation.padded_rows(kept, width)
        scores, generated = [], []
        for start in range(0, len(examples), batch_size):
            batch = predict.fill_batch({"tokens": tokens[start:start + batch_size],
                                        "lengths": lengths[start:start + batch_size]}, batch_size)
            inputs = evaluation.model_inputs(config, batch["tokens"], batch["lengths"])
            scores.append(evaluation.label_log_likelihoods(module, params, inputs, label_tokens, label_lengths))
            generated.append(decoding.greedy(module, params, inputs, max_decode_length=answer_length).tokens)
        scores = np.concatenate([np.asarray(s) for s in scores])[:len(examples)]
        finite.require_finite(scores, "log-likelihoods of the labels")
        generated = np.concatenate([np.asarray(g) for g in generated])[:len(examples)]
        done = evaluation.batch_flops(config, lengths, decoded=generated, label_lengths=label_lengths)
        chosen = [labels[i] for i in scores.argmax(axis=1)]
        answers = [cut_generation(predict.detokenize(vocabulary, predict.until_eos(ids, config.eos_token_id)),
                                  self.separator) for ids in generated]
        targets = [task.postprocess(texts(ex)[1], example=ex, is_target=True) for ex in examples]
        score = lambda answers: metrics_lib.compute_metrics(task.metric_fns, targets, [
            task.postprocess(a, example=ex, is_target=False) for a, ex in zip(answers, examples)])
        metrics = {**score(answers), **{evaluation.SCORE_PREFIX + k: v for k, v in score(chosen).items()}}
        records = [{"prompt": p, "target": texts(ex)[1], "prediction": a, "score_prediction": c}
                   for p, ex, a, c in zip(prompts, examples, answers, chosen)]
        return evaluation.EvalResult(metrics, records, flops=done)

    def _prompt_budget(self, config, answer_length: int) -> int:
        positions = config.max_position_embeddings if config.position_encoding == "learned" else 1024
        max_length = self.max_length or positions
        if max_length > positions:
            raise ConfigError(f"FewShot.max_length={max_length} exceeds the model's {positions} positions")
        if max_length <= answer_length:
            raise ConfigError(f"FewShot.max_length={max_length} leaves no room for a prompt before a "
                              f"{answer_length}-token answer")
        return max_length - answer_length
