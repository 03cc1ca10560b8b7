"""Inference: decoding over a KV cache (greedy, sampling, beam search), scoring, task evaluation."""
from t5lite.infer.decoding import DecodeResult, beam_search, greedy, temperature_sample

__all__ = ["DecodeResult", "beam_search", "greedy", "temperature_sample"]
