"""Where the time of one t5lite pre-training step goes on the CPU, op by op.

The step is the one benchmarks/train_throughput.py times (TrainTask.jit_train_step, Adafactor,
float32, synthetic batch). A `jax.profiler` trace of `--steps` steps records every XLA op the CPU
runtime executed; each op's time goes to a group named by what the compiled HLO says it computes:
a fusion holding a dot is a matmul (split by the dot's Flax module path into attention QK/AV,
q/k/v/o projections, MLP and vocabulary head, forward or backward); a fusion of only data movement
(copy, transpose, bitcast, slice...) is layout; the rest goes by its metadata's op_name (relative-
position bias, attention softmax and masks, the loss over the vocabulary, layer norms, other model
elementwise; outside the model: Adafactor with the gradient norm and finite checks). Times are op
time summed over the runtime's threads, so the groups add up to the traced op time, not the wall.
    python benchmarks/step_profile.py [--preset t5_small] [--batch 8] [--inputs 512] [--targets 114] [--steps 2]
    python benchmarks/step_profile.py --preset t5_tiny --batch 2 --inputs 32 --targets 8  # smoke run
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

os.environ["JAX_PLATFORMS"] = "cpu"   # before JAX initialises, as train_throughput.py
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402

from t5lite.models import get_config  # noqa: E402
from train_throughput import synthetic_batch, t5lite_step_fn  # noqa: E402

MATMUL = {"dot", "convolution"}
LAYOUT = {"copy", "transpose", "bitcast", "reshape", "slice", "concatenate", "pad", "parameter", "tuple",
          "get-tuple-element", "dynamic-slice", "dynamic-update-slice", "copy-start", "copy-done"}
# (matmul part, pattern on the dot's op_name), first match wins.
MATMUL_PARTS = (("attention QK / AV", r"bqhd,bhkd->bhqk|bhqk,bhkd->bqhd"),
                ("attention q, k, v, o projections", r"_attention/(query|key|value|out)\b"),
                ("MLP (wi, wo)", r"/mlp/"),
                ("vocabulary head", r"lm_head"),
                ("other", r""))
# (group, pattern on a non-matmul, non-layout op's op_name), first match wins.
GROUPS = (("relative-position bias", r"relpos_bias"),
          ("layer norms (RMSNorm)", r"_norm\b"),
          ("attention softmax, elementwise", r"_attention\b"),
          ("attention masks and bias rows, once per stack", r"_padding_mask|\.(en|de)code/(en|de)coder/[^/]+$"),
          ("loss: log-softmax / cross entropy over the vocabulary", r"jvp\(\)|_one_hot|lm_head"),
          ("other model ops (ReLU, residuals, embeddings)", r"EncoderDecoder"),
          ("Adafactor update, gradient norm, finite checks", r"^jit\(train_step\)/"),
          ("other (no metadata)", r""))
LAYOUT_GROUP = "copies, transposes, layout"


class Op(collections.namedtuple("Op", "opcodes op_name dot_names")):
    """An HLO instruction: the opcodes it runs (its own and its called computations'), its
    metadata op_name and the op_names of the dots it runs."""


def parse_hlo(text: str) -> dict[str, Op]:
    computations, instrs, current = collections.defaultdict(list), {}, None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) \(", line)
        if head:
            current = head.group(1)
            continue
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = .*? ([a-z][\w\-]*)\(", line)
        if m:
            meta = re.search(r'op_name="([^"]*)"', line)
            called = re.findall(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)", line)
            instrs[m.group(1)] = (m.group(2), meta.group(1) if meta else "", called)
            computations[current].append(m.group(1))

    def expand(name, seen=()):
        opcode, op_name, called = instrs[name]
        opcodes, dots, names = {opcode}, [op_name] if opcode in MATMUL else [], [op_name]
        for comp in called:
            for child in computations[comp]:
                if child not in seen:
                    c = expand(child, seen + (name,))
                    opcodes |= c.opcodes
                    dots += c.dot_names
                    names.append(c.op_name)
        return Op(opcodes, op_name or next((n for n in reversed(names) if n), ""), dots)
    return {name: expand(name) for name in instrs}


def group_of(op: Op) -> str:
    if op.opcodes & MATMUL:
        name = next((n for n in op.dot_names if n), op.op_name)
        part = next(p for p, pattern in MATMUL_PARTS if re.search(pattern, name))
        return f"matmul: {part}, {'backward' if 'transpose(jvp' in name else 'forward'}"
    if op.opcodes - {"fusion"} <= LAYOUT:
        return LAYOUT_GROUP
    return next(g for g, pattern in GROUPS if re.search(pattern, op.op_name))


def profile(run, hlo_ops: dict[str, Op], steps: int) -> dict[str, float]:
    """Milliseconds of op time per step in each group, from a trace of `steps` calls of `run`."""
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        for _ in range(steps):
            run()
        jax.profiler.stop_trace()
        path = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)[0]
        with gzip.open(path) as f:
            events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    totals: dict[str, float] = collections.Counter()
    for e in events:
        op = hlo_ops.get((e.get("args") or {}).get("hlo_op"))
        if e.get("ph") == "X" and op and not op.opcodes & {"while", "call", "conditional"}:
            totals[group_of(op)] += e["dur"] / 1e3 / steps
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="t5_small")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--targets", type=int, default=114)
    parser.add_argument("--steps", type=int, default=2, help="steps traced")
    args = parser.parse_args()
    cfg = get_config(args.preset, dropout_rate=0.0)
    batch = synthetic_batch(args.batch, args.inputs, args.targets, cfg.vocab_size)
    run = t5lite_step_fn(cfg, batch)
    run()   # compile, warm up
    hlo = run.compiled_text()
    start = time.perf_counter()
    run()
    wall_ms = (time.perf_counter() - start) * 1e3
    totals = profile(run, parse_hlo(hlo), args.steps)
    total = sum(totals.values())
    matmul = sum(ms for g, ms in totals.items() if g.startswith("matmul"))
    print(f"{args.preset}: batch {args.batch}, inputs {args.inputs}, targets {args.targets}, float32, Adafactor; "
          f"{jax.devices()[0].device_kind}; untraced step {wall_ms:.0f} ms wall; {args.steps} traced steps: "
          f"{total:.0f} ms of XLA op time per step (summed over threads)\n")
    print("| group | ms / step | share of op time |")
    print("|---|---|---|")
    for group, ms in sorted(totals.items(), key=lambda kv: (not kv[0].startswith("matmul"), -kv[1])):
        print(f"| {group} | {ms:.1f} | {100 * ms / total:.1f}% |")
    print(f"\nmatmuls {matmul:.0f} ms ({100 * matmul / total:.1f}%), everything else {total - matmul:.0f} ms "
          f"({100 * (total - matmul) / total:.1f}%)")


if __name__ == "__main__":
    main()
