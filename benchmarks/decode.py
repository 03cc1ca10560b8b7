"""Decoding speed of t5lite vs Hugging Face `generate` on the same (random) weights, float32.

Cases: T5 greedy (batch of encoder inputs), T5 beam search (4 beams, no length penalty), GPT-2
greedy (prompts of different lengths, left-padded for HF). Prints new tokens/s (batch x new
tokens / median time of `--runs` runs, after one warm-up that compiles) and the ratio.
    python benchmarks/decode.py                        # t5_small / gpt2_small, inputs 512, 64 new
    python benchmarks/decode.py --t5 t5_tiny --gpt2 gpt2_tiny --inputs 64 --prompt 24 32 --new 16
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from t5lite import models
from t5lite.infer import decoding
from t5lite.interop import hf


def random_model(preset: str, scale: float = 0.05):
    """A t5lite module, its params and the same weights as an HF PyTorch model."""
    import transformers
    module = models.build(models.get_config(preset, dropout_rate=0.0))
    tokens = jnp.zeros((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), encoder_input_tokens=tokens,
                                                decoder_input_tokens=tokens))
    rng = np.random.RandomState(0)
    variables = jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, scale, s.shape), s.dtype), shapes)
    folder = hf.save(module, variables, tempfile.mkdtemp(prefix="t5lite_decode_bench_"))
    with open(os.path.join(folder, "config.json")) as f:
        hf_class = getattr(transformers, json.load(f)["architectures"][0])
    return module, variables["params"], hf_class.from_pretrained(folder).eval()


def median_seconds(fn, runs: int) -> float:
    fn()   # compile / warm up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cases(args):
    import torch
    rng = np.random.RandomState(1)
    t5, t5_params, t5_hf = random_model(args.t5)
    enc = rng.randint(3, t5.config.vocab_size, (args.batch, args.inputs)).astype(np.int32)
    t5_hf_in = dict(input_ids=torch.tensor(enc), attention_mask=torch.ones(enc.shape, dtype=torch.long))
    yield (f"{args.t5} greedy", lambda: decoding.greedy(t5, t5_params, {"encoder_input_tokens": jnp.asarray(enc)},
                                                        max_decode_length=args.new).tokens.block_until_ready(),
           lambda: t5_hf.generate(**t5_hf_in, max_new_tokens=args.new, do_sample=False))
    yield (f"{args.t5} beam 4", lambda: decoding.beam_search(t5, t5_params, {"encoder_input_tokens": jnp.asarray(enc)},
                                                             max_decode_length=args.new, num_beams=4,
                                                             alpha=0.0).tokens.block_until_ready(),
           lambda: t5_hf.generate(**t5_hf_in, max_new_tokens=args.new, do_sample=False, num_beams=4,
                                  length_penalty=0.0))
    gpt, gpt_params, gpt_hf = random_model(args.gpt2)
    low, high = args.prompt
    lengths = rng.randint(low, high + 1, args.batch)
    prompt = np.zeros((args.batch, high), np.int32)
    left, mask = np.zeros_like(prompt), np.zeros_like(prompt)
    for r, n in enumerate(lengths):
        prompt[r, :n] = left[r, high - n:] = rng.randint(0, gpt.config.vocab_size, n)
        mask[r, high - n:] = 1
    ours_in = {"decoder_prompt_tokens": jnp.asarray(prompt), "decoder_prompt_lengths": jnp.asarray(lengths)}
    yield (f"{args.gpt2} greedy", lambda: decoding.greedy(gpt, gpt_params, ours_in,
                                                          max_decode_length=args.new).tokens.block_until_ready(),
           lambda: gpt_hf.generate(input_ids=torch.tensor(left), attention_mask=torch.tensor(mask),
                                   max_new_tokens=args.new, do_sample=False,
                                   pad_token_id=gpt.config.eos_token_id))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--t5", default="t5_small")
    parser.add_argument("--gpt2", default="gpt2_small")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--prompt", type=int, nargs=2, default=(200, 256), help="GPT-2 prompt lengths: low high")
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    import torch
    torch.set_grad_enabled(False)
    print("| case | t5lite tokens/s | HF tokens/s | ratio |\n|---|---|---|---|")
    for name, ours, theirs in cases(args):
        tokens = args.batch * args.new
        a, b = tokens / median_seconds(ours, args.runs), tokens / median_seconds(theirs, args.runs)
        print(f"| {name} | {a:.0f} | {b:.0f} | {a / b:.2f} |", flush=True)


if __name__ == "__main__":
    main()
