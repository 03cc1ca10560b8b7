"""Full vs Longformer (windowed) attention against sequence length: step time and peak memory.

The step is the forward and backward pass (gradients of every parameter) of an encoder layer stack,
jitted. Peak memory is XLA's compiled memory analysis of that step (arguments + outputs + temporaries),
read without running it, so it is reported at every length; step time is the median of alternating
full / windowed runs, up to --max_timed_length. Full attention's memory grows as n^2, the window's as n.
    python benchmarks/long_attention.py [--lengths 512,1024,...] [--window 256] [--out DIR] [--dry_run]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp

from t5lite.models import build_module, get_config
from t5lite.plotting import plain_ticks, pyplot

KINDS = ("full", "windowed")


def model_config(window: int | None, layers: int, d_model: int):
    """A BERT-layout encoder with rotary positions (no position table to outgrow) and no output head."""
    heads = max(d_model // 64, 1)
    return get_config("bert_tiny", num_encoder_layers=layers, d_model=d_model, num_heads=heads,
                      head_dim=d_model // heads, d_ff=4 * d_model, position_encoding="rotary", encoder_head="none",
                      pooler=False, sentence_head=False, dropout_rate=0.0, attention_window=window)


def compiled_step(config, length: int, batch: int):
    """The jitted forward + backward of the stack, compiled for [batch, length] tokens, and its inputs."""
    module = build_module(config)
    tokens = jnp.ones((batch, length), jnp.int32)
    params = jax.jit(module.init)(jax.random.PRNGKey(0), encoder_input_tokens=tokens[:, :8])["params"]
    loss = lambda p, t: jnp.mean(jnp.square(module.apply({"params": p}, encoder_input_tokens=t)))
    step = jax.jit(jax.grad(loss))
    return step.lower(params, tokens).compile(), (params, tokens)


def peak_mib(compiled) -> float:
    stats = compiled.memory_analysis()
    total = stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
    return (total - stats.alias_size_in_bytes) / 2 ** 20


def seconds(compiled, inputs) -> float:
    start = time.perf_counter()
    jax.block_until_ready(compiled(*inputs))
    return time.perf_counter() - start


def measure(length: int, args) -> dict:
    """One length: both kinds' peak MiB, and (up to --max_timed_length) their median step seconds."""
    steps = {kind: compiled_step(model_config(args.window if kind == "windowed" else None, args.layers,
                                              args.d_model), length, args.batch) for kind in KINDS}
    row = {"length": length, **{f"{kind}_mib": peak_mib(steps[kind][0]) for kind in KINDS}}
    if length <= args.max_timed_length:
        for kind in KINDS:
            seconds(*steps[kind])   # warm-up
        times = {kind: [] for kind in KINDS}
        for _ in range(args.repeats):   # alternate, so that load on the machine falls on both alike
            for kind in KINDS:
                times[kind].append(seconds(*steps[kind]))
        row.update({f"{kind}_ms": 1000 * statistics.median(times[kind]) for kind in KINDS})
    return row


def table(rows) -> str:
    cell = lambda row, key, fmt: format(row[key], fmt) if key in row else "-"
    lines = ["| length | full ms | windowed ms | full MiB | windowed MiB |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['length']} | {cell(r, 'full_ms', '.0f')} | {cell(r, 'windowed_ms', '.0f')} | "
              f"{r['full_mib']:.0f} | {r['windowed_mib']:.0f} |" for r in rows]
    return "\n".join(lines)


def plot(rows, window: int, path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, unit, label in ((axes[0], "ms", "step time (ms)"), (axes[1], "mib", "peak memory (MiB)")):
        for kind in KINDS:
            points = [(r["length"], r[f"{kind}_{unit}"]) for r in rows if f"{kind}_{unit}" in r]
            if points:
                ax.plot(*zip(*points), marker="o", label=f"{kind}" + (f" (window {window})" if kind != "full" else ""))
        ax.set(xscale="log", yscale="log", xlabel="sequence length (tokens)", ylabel=label)
        ax.grid(True, which="both", alpha=.3)
        plain_ticks(ax)
        ax.legend()
    axes[0].set_title("forward + backward of the encoder stack")
    axes[1].set_title("XLA's compiled memory: n² vs n")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192,16384", help="comma-separated lengths")
    parser.add_argument("--max_timed_length", type=int, default=4096, help="time steps up to this length")
    parser.add_argument("--window", type=int, default=256, help="Longformer's attention_window (keys either side: half)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="long_attention", help="folder for long_attention.json and .png")
    parser.add_argument("--dry_run", action="store_true", help="tiny sizes: checks the benchmark runs")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.lengths, args.max_timed_length, args.window, args.layers, args.d_model, args.repeats = "32,64", 64, 8, 1, 32, 1
    rows = []
    for length in (int(n) for n in args.lengths.split(",")):
        rows.append(measure(length, args))
        print(table(rows).splitlines()[-1], flush=True)
    print(f"\n{jax.devices()[0].device_kind}, window {args.window}, {args.layers} layers x d_model {args.d_model}, "
          f"batch {args.batch}, median of {args.repeats}\n{table(rows)}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "long_attention.json"), "w") as f:
        json.dump({"window": args.window, "layers": args.layers, "d_model": args.d_model, "rows": rows}, f, indent=1)
    plot(rows, args.window, os.path.join(args.out, "long_attention.png"))
    return rows


if __name__ == "__main__":
    main()
