"""Inference: decoding over a KV cache (greedy, sampling, beam search), scoring, task evaluation
(also few-shot, in context), and `t5lite infer`."""
from t5lite.infer.decoding import DecodeResult, beam_search, greedy, temperature_sample
from t5lite.infer import fewshot  # noqa: F401  (registers @FewShot() with gin for `t5lite eval`)

__all__ = ["DecodeResult", "beam_search", "greedy", "temperature_sample"]
