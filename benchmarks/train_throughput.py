"""Training throughput of t5lite vs Hugging Face's PyTorch T5, same config, batch and optimizer.

Prints tokens/s, step time (median over runs) and MFU for each preset (default t5_small and
t5_1_1_small; batch 8, inputs 512, targets 114) for both, and their ratio. Both use Adafactor
(T5's settings) and float32. The timed runs alternate (t5lite, HF, t5lite, HF, ...) so that load
from other processes hits both sides alike. MFU uses one peak for both rows, measured first: on a
CPU the best float32 matmul of JAX and of PyTorch over several sizes (t5lite.train.mfu), so
neither implementation can exceed 100%. JAX runs on the CPU (JAX_PLATFORMS=cpu), like PyTorch.
    python benchmarks/train_throughput.py [--presets t5_small t5_1_1_small] [--batch 8] [--steps 3] [--runs 3]
    python benchmarks/train_throughput.py --presets t5_tiny --batch 4 --inputs 64 --targets 16  # smoke run
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ["JAX_PLATFORMS"] = "cpu"   # before JAX initialises: never probe an installed TPU runtime

import jax  # noqa: E402
import numpy as np

from t5lite.models import flops, get_config
from t5lite.train import mfu, optimizers
from t5lite.train.partitioning import Partitioner
from t5lite.train.step import TrainTask


def synthetic_batch(batch: int, inputs: int, targets: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    enc = rng.integers(3, vocab, (batch, inputs)).astype(np.int32)
    tgt = rng.integers(3, vocab, (batch, targets)).astype(np.int32)
    dec_in = np.concatenate([np.zeros((batch, 1), np.int32), tgt[:, :-1]], axis=1)
    return {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in, "decoder_target_tokens": tgt,
            "decoder_loss_weights": np.ones_like(tgt)}


def time_interleaved(step_fns: list, steps: int, runs: int) -> list[list[float]]:
    """Seconds per step of each function, one entry per run of `steps` steps; the functions take
    turns run by run (A, B, A, B, ...), so a burst of outside load does not favour either."""
    for step in step_fns:
        step()  # compile / warm up
    out = [[] for _ in step_fns]
    for _ in range(runs):
        for step, times in zip(step_fns, out):
            start = time.perf_counter()
            for _ in range(steps):
                step()
            times.append((time.perf_counter() - start) / steps)
    return out


def t5lite_step_fn(cfg, batch):
    schedule = optimizers.constant(1e-3)
    partitioner = Partitioner()
    trainer = TrainTask(cfg, optimizers.adafactor(schedule), schedule, partitioner,
                        {k: v.shape[1] for k, v in batch.items()}, num_microbatches=1)
    holder = {"state": trainer.init_state(0)}
    step = trainer.jit_train_step()
    sharded = partitioner.shard_batch(batch)

    def run():
        with trainer.mesh_context():
            holder["state"], metrics = step(holder["state"], sharded)
        jax.block_until_ready(metrics["loss"])

    def compiled_text():
        """The step's optimised HLO, for reading a profile's op names (benchmarks/step_profile.py)."""
        with trainer.mesh_context():
            return step.lower(holder["state"], sharded).compile().as_text()
    run.compiled_text = compiled_text
    return run


def hf_step_fn(cfg, batch):
    import torch
    from transformers import T5Config, T5ForConditionalGeneration
    from transformers.optimization import Adafactor

    hf_cfg = T5Config(vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_kv=cfg.head_dim, d_ff=cfg.d_ff,
                      num_layers=cfg.num_encoder_layers, num_decoder_layers=cfg.num_decoder_layers,
                      num_heads=cfg.num_heads, dropout_rate=cfg.dropout_rate,
                      feed_forward_proj="gated-gelu" if len(cfg.mlp_activations) > 1 else "relu",
                      tie_word_embeddings=cfg.tie_embeddings, decoder_start_token_id=0)
    model = T5ForConditionalGeneration(hf_cfg).train()
    opt = Adafactor(model.parameters(), lr=1e-3, relative_step=False, scale_parameter=True, warmup_init=False,
                    decay_rate=-0.8, clip_threshold=1.0)
    t = {k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items()}

    def run():
        out = model(input_ids=t["encoder_input_tokens"], attention_mask=t["encoder_input_tokens"] > 0,
                    decoder_input_ids=t["decoder_input_tokens"], labels=t["decoder_target_tokens"])
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return run


def peak_flops() -> tuple[float, str]:
    """The device's peak; on a CPU the better of JAX's and PyTorch's best matmul."""
    peak, source = mfu.peak_flops_per_device()
    if jax.devices()[0].platform != "cpu":
        return peak, source
    import torch

    def torch_matmul(n):
        a = torch.ones(n, n)
        return lambda: a @ a
    torch_peak = mfu.best_matmul_flops(torch_matmul)
    return max(peak, torch_peak), f"best f32 matmul on this CPU: JAX {peak:.3g}, PyTorch {torch_peak:.3g}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["t5_small", "t5_1_1_small"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--targets", type=int, default=114)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    peak, source = peak_flops()
    print(f"peak {peak:.3g} FLOP/s ({source}); XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    tokens = args.batch * (args.inputs + args.targets)
    for preset in args.presets:
        cfg = get_config(preset, dropout_rate=0.0)
        batch = synthetic_batch(args.batch, args.inputs, args.targets, cfg.vocab_size)
        step_flops = args.batch * flops.train_flops_per_example(cfg, args.inputs, args.targets)
        names = ("t5lite (JAX, jit)", "HF transformers (PyTorch eager)")
        times = time_interleaved([t5lite_step_fn(cfg, batch), hf_step_fn(cfg, batch)], args.steps, args.runs)
        print(f"\n{preset}: batch {args.batch}, inputs {args.inputs}, targets {args.targets}, float32, Adafactor; "
              f"{step_flops:.3g} FLOPs/step; median of {args.runs} interleaved runs x {args.steps} steps")
        print(f"{'implementation':34s} {'s/step':>8s} {'tokens/s':>10s} {'MFU':>7s}")
        rates = []
        for name, runs in zip(names, times):
            seconds = statistics.median(runs)
            rates.append(tokens / seconds)
            print(f"{name:34s} {seconds:8.3f} {tokens / seconds:10.0f} "
                  f"{step_flops / seconds / (peak * jax.device_count()):7.1%}")
        print(f"ratio t5lite / HF tokens/s: {rates[0] / rates[1]:.2f}x", flush=True)


if __name__ == "__main__":
    main()
