"""Beam search with verification, as Lample & Charton evaluate (2019): decode a beam
of hypotheses per question and answer with the best-scored one a verifier accepts; the question
is solved when one does. A verifier needs only the question (is the hypothesis' derivative the
integrand? does the source compile to the listing?), so this is a fair way to answer, not a
peek at the target: the task's `VERIFIERS` (t5lite.data.tasks.symbolic) provide them.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np

from t5lite.data import converters
from t5lite.infer import decoding, predict
from t5lite.infer.evaluation import Evaluator, model_inputs, text_of

Verifier = Callable[[str, str], bool]   # (hypothesis, question) -> accepted


@dataclasses.dataclass
class VerifiedBeam:
    """Per question: the beam's hypotheses, best first, and the answer chosen."""
    beam_size: int
    hypotheses: list[list[str]]
    answers: list[str]
    verified: list[bool]

    @property
    def accuracy(self) -> float:
        """Percentage of questions whose beam held a hypothesis the verifier accepts."""
        return 100.0 * float(np.mean(self.verified))


def beams(module, params, evaluator: Evaluator, beam_size: int) -> list[list[str]]:
    """Each question's `beam_size` hypotheses (text, best first), in the split's order."""
    cfg, out = module.config, []
    for batch in evaluator.batches:
        inputs = model_inputs(cfg, batch["inputs"], batch["input_lengths"])
        out.append(decoding.beam_search(module, params, inputs, max_decode_length=evaluator.max_decode_length,
                                        num_beams=beam_size).tokens)
    tokens = np.concatenate(jax.device_get(out))[:len(evaluator.examples)]
    tokens = converters.restore_order(tokens, evaluator.order)
    return [[predict.detokenize(evaluator.vocabulary, predict.until_eos(row, cfg.eos_token_id)) for row in rows]
            for rows in tokens]


def verified_beam(module, params, evaluator: Evaluator, verify: Verifier, beam_size: int) -> VerifiedBeam:
    """The first hypothesis of each beam that `verify(hypothesis, question)` accepts, else the best."""
    vocabulary = evaluator.task.output_features["inputs"].vocabulary
    questions = [text_of(ex, "inputs", vocabulary) for ex in evaluator.examples]
    hypotheses = beams(module, params, evaluator, beam_size)
    answers, verified = [], []
    for question, beam in zip(questions, hypotheses):
        accepted = next((h for h in beam if verify(h, question)), None)
        answers.append(beam[0] if accepted is None else accepted)
        verified.append(accepted is not None)
    return VerifiedBeam(beam_size, hypotheses, answers, verified)


def accuracy_by_beam_size(module, params, evaluator: Evaluator, verify: Verifier,
                          beam_sizes: Sequence[int] = (1, 2, 4, 8)) -> dict[int, float]:
    """Verified accuracy for each beam size."""
    return {k: verified_beam(module, params, evaluator, verify, k).accuracy for k in beam_sizes}
