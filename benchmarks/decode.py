"""Decoding speed of t5lite vs Hugging Face `generate` on the same (random) weights, float32.

Cases: T5 greedy (batch of encoder inputs), T5 beam search (4 beams, HF's rules, no length penalty), GPT-2
greedy (prompts of different lengths, left-padded for HF). Both run in this process on the same
`--threads` cores (CPU affinity, which sizes XLA's thread pool, and torch's thread count); their
timed runs alternate, so machine load hits both alike. Prints new tokens/s (batch x new tokens /
median time of `--runs` runs, after one warm-up that compiles), the ratio, and whether the best
sequences are token for token HF's (each row up to its EOS).
    python benchmarks/decode.py                        # t5_small / gpt2_small, inputs 512, 64 new
    python benchmarks/decode.py --t5 t5_tiny --gpt2 gpt2_tiny --inputs 64 --prompt 24 32 --new 16
    python benchmarks/decode.py --cases greedy --split   # + first token (encoder) vs loop seconds
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np


def random_model(preset: str, seed: int = 0, device: str = "cpu"):
    """A t5lite module with its own initial weights (T5's fan-in scaling, GPT-2's 0.02) and the same
    weights as an HF PyTorch model (on torch `device`).

    Those weights give logits with a spread near 1, so greedy and beam decisions are margins far
    above float32 noise and the token check is meaningful. Weights all drawn N(0, 0.05) make the
    model flat (logits within 0.01 of each other: candidates tie to the last bit and each library
    breaks ties its own way); N(0, 0.5) makes T5's unscaled attention logits ~1e3, where one
    float32 rounding of the weights moves the logits by 0.4."""
    import jax
    import jax.numpy as jnp
    import transformers

    from t5lite import models
    from t5lite.interop import hf
    module = models.build(models.get_config(preset, dropout_rate=0.0))
    tokens = jnp.zeros((1, 4), jnp.int32)
    variables = jax.jit(lambda: module.init(jax.random.PRNGKey(seed), encoder_input_tokens=tokens,
                                            decoder_input_tokens=tokens))()
    folder = hf.save(module, variables, tempfile.mkdtemp(prefix="t5lite_decode_bench_"))
    with open(os.path.join(folder, "config.json")) as f:
        hf_class = getattr(transformers, json.load(f)["architectures"][0])
    return module, variables["params"], hf_class.from_pretrained(folder).float().to(device).eval()


def until_eos(tokens, eos: int, pad: int) -> np.ndarray:
    """Rows cut after their first EOS and padded with `pad` (HF and t5lite pad differently)."""
    tokens = np.array(tokens)
    after_eos = (np.cumsum(tokens == eos, axis=1) - (tokens == eos)) > 0
    return np.where(after_eos, pad, tokens)


def timed(fns, runs: int) -> tuple[list[float], list]:
    """Median seconds of each function over `runs` interleaved rounds (after one warm-up each)
    and their last outputs."""
    out = [fn() for fn in fns]
    times = [[] for _ in fns]
    for _ in range(runs):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            out[i] = fn()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times], out


def cases(args):
    """(name, ours(new) -> tokens [batch, new], theirs(new) -> tokens [batch, <= new], eos id) per
    case in `args.cases`; `new` is the number of tokens to generate. Hugging Face runs on torch
    device `args.torch_device` (default the CPU)."""
    import jax.numpy as jnp
    import torch

    from t5lite.infer import decoding
    device = getattr(args, "torch_device", "cpu")
    hf_new = lambda out, start: out[:, start:].cpu().numpy()
    if {"greedy", "beam"} & set(args.cases):
        t5, t5_params, t5_hf = random_model(args.t5, device=device)
        rng = np.random.RandomState(1)
        enc = {"encoder_input_tokens": jnp.asarray(rng.randint(3, t5.config.vocab_size, (args.batch, args.inputs)),
                                                   jnp.int32)}
        t5_hf_in = dict(input_ids=torch.tensor(np.asarray(enc["encoder_input_tokens"]), dtype=torch.long, device=device),
                        attention_mask=torch.ones((args.batch, args.inputs), dtype=torch.long, device=device))
    if "greedy" in args.cases:
        yield (f"{args.t5} greedy",
               lambda new: np.asarray(decoding.greedy(t5, t5_params, enc, max_decode_length=new).tokens),
               lambda new: hf_new(t5_hf.generate(**t5_hf_in, max_new_tokens=new, do_sample=False), 1),
               t5.config.eos_token_id)
    if "beam" in args.cases:
        yield (f"{args.t5} beam 4",
               lambda new: np.asarray(decoding.beam_search(t5, t5_params, enc, max_decode_length=new, num_beams=4,
                                                           alpha=0.0, rules="hf").tokens[:, 0]),
               lambda new: hf_new(t5_hf.generate(**t5_hf_in, max_new_tokens=new, do_sample=False, num_beams=4,
                                                 length_penalty=0.0, early_stopping=False), 1),
               t5.config.eos_token_id)
    if "gpt2" in args.cases:
        gpt, gpt_params, gpt_hf = random_model(args.gpt2, device=device)
        rng = np.random.RandomState(2)   # the same prompts whichever cases run
        low, high = args.prompt
        lengths = rng.randint(low, high + 1, args.batch)
        prompt = np.zeros((args.batch, high), np.int32)
        left, mask = np.zeros_like(prompt), np.zeros_like(prompt)
        for r, n in enumerate(lengths):
            prompt[r, :n] = left[r, high - n:] = rng.randint(0, gpt.config.vocab_size, n)
            mask[r, high - n:] = 1
        ours_in = {"decoder_prompt_tokens": jnp.asarray(prompt), "decoder_prompt_lengths": jnp.asarray(lengths)}
        gpt_hf_in = dict(input_ids=torch.tensor(left, dtype=torch.long, device=device),
                         attention_mask=torch.tensor(mask, device=device))
        yield (f"{args.gpt2} greedy",
               lambda new: np.asarray(decoding.greedy(gpt, gpt_params, ours_in, max_decode_length=new).tokens),
               lambda new: hf_new(gpt_hf.generate(**gpt_hf_in, max_new_tokens=new, do_sample=False,
                                                  pad_token_id=gpt.config.eos_token_id), high),
               gpt.config.eos_token_id)


def measure(args):
    """One dict per case: tokens/s of both libraries (median of `args.runs`), their ratio, whether
    the best sequences agree, and with `args.split` the first token's and the loop's seconds."""
    for name, ours, theirs, eos in cases(args):
        fns = [lambda: ours(args.new), lambda: theirs(args.new)]
        if args.split:
            fns += [lambda: ours(1), lambda: theirs(1)]
        seconds, outputs = timed(fns, args.runs)
        ours_tokens, hf_tokens = outputs[:2]
        hf_tokens = until_eos(np.pad(hf_tokens, ((0, 0), (0, args.new - hf_tokens.shape[1])), constant_values=eos),
                              eos, -1)
        tokens = args.batch * args.new
        row = dict(case=name, t5lite_tokens_per_s=tokens / seconds[0], hf_tokens_per_s=tokens / seconds[1],
                   ratio=seconds[1] / seconds[0], same_tokens=bool(np.array_equal(until_eos(ours_tokens, eos, -1),
                                                                                  hf_tokens)))
        if args.split:
            row.update(first_token_s=seconds[2:4], loop_s=[seconds[0] - seconds[2], seconds[1] - seconds[3]])
        yield row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--t5", default="t5_small")
    parser.add_argument("--gpt2", default="gpt2_small")
    parser.add_argument("--cases", nargs="+", choices=("greedy", "beam", "gpt2"), default=("greedy", "beam", "gpt2"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--prompt", type=int, nargs=2, default=(200, 256), help="GPT-2 prompt lengths: low high")
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--split", action="store_true",
                        help="also time the first token alone (encoder or prompt prefill + one step) and report "
                             "the rest as the loop: its seconds, ms per step and ratio")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="cores for both libraries (default: all this process may use)")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")   # never initialise libtpu on a TPU-less host
    # Before jax starts: XLA sizes its thread pool from the CPU affinity.
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.threads])
    import torch
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    print(f"threads: {args.threads}, runs: {args.runs} (median), new tokens: {args.new}, batch: {args.batch}")
    split_header = (" first token s (t5lite / HF) | loop s (t5lite / HF) | ms per step (t5lite / HF) | loop ratio |"
                    if args.split else "")
    print(f"| case | t5lite tokens/s | HF tokens/s | ratio | same tokens |{split_header}")
    print("|---" * (5 + 4 * args.split) + "|")
    for r in measure(args):
        line = (f"| {r['case']} | {r['t5lite_tokens_per_s']:.0f} | {r['hf_tokens_per_s']:.0f} | {r['ratio']:.2f} | "
                f"{'yes' if r['same_tokens'] else 'NO'} |")
        if args.split:
            first, loop, steps = r["first_token_s"], r["loop_s"], args.new - 1
            line += (f" {first[0]:.2f} / {first[1]:.2f} | {loop[0]:.2f} / {loop[1]:.2f} | "
                     f"{1e3 * loop[0] / steps:.1f} / {1e3 * loop[1] / steps:.1f} | {loop[1] / loop[0]:.2f} |")
        print(line, flush=True)


if __name__ == "__main__":
    main()
