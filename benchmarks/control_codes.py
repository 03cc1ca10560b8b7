"""Does a control code steer generation? CTRL's measurement (Keskar et al. 2019) on SST-2 sentiment
(docs/guides/control-codes.md): `--samples` generations from each code's prompt by a control LM
(`--control_lm`, trained with configs/local/gpt2_tiny_control_sst2.gin), each scored by an SST-2
classifier (`--classifier`, a task-head run, with the `--classifier_gin` it was trained with); per
code, the share the classifier puts in that code's class (its agreement) with a 95% Wilson
interval. A model that ignored its code would give agreements summing to 1 over the two codes.

The generations go through `t5lite eval` as an SST-2 dev file labelled with their codes (written
to `--out/generated/SST-2/dev.tsv`), so the classifier reads them exactly as it reads SST-2; its
accuracy on them is the agreement. Writes `--out/control_codes.json`, `--out/generations.jsonl`
(code, text, class) and `--out/control_codes.png`, and prints a markdown table.
    python benchmarks/control_codes.py --control_lm runs/control --classifier runs/minilm_sst2 --out runs/control/codes
"""
from __future__ import annotations

import csv
import json
import math
import os
import sys

CODES = ("negative", "positive")   # SST-2's label names: the codes of sst2_control_lm (label id = index)
Z95 = 1.959963984540054            # the standard normal's 97.5% quantile


def _args(argv):
    from t5lite.cli import Parser
    parser = Parser(prog="control_codes.py", description=__doc__.split("\n")[0])
    parser.add_argument("--control_lm", required=True, help="a run trained on sst2_control_lm (or one of its steps)")
    parser.add_argument("--vocabulary_kind", default="byte_bpe",
                        help="the control LM's vocabulary.kind (the shipped config's: byte_bpe, the tiny one)")
    parser.add_argument("--classifier", required=True, help="an SST-2 classifier run (a task head)")
    parser.add_argument("--classifier_gin", default="configs/local/minilm_finetune_sst2.gin",
                        help="the config the classifier was trained with: its head and evaluator")
    parser.add_argument("--out", required=True, help="folder for the generations, the JSON and the plot")
    parser.add_argument("--samples", type=int, default=200, help="generations per code")
    parser.add_argument("--max_decode_length", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top_k", type=int, default=40)
    parser.add_argument("--repetition_penalty", type=float, default=1.2, help="CTRL's; 1.0 is off")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a binomial proportion (it stays inside [0, 1] and holds its
    coverage at small counts and near 0 or 1, where the normal approximation does not)."""
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return centre - half, centre + half


def generate(args) -> list[dict]:
    """`--samples` sampled continuations of each code's prompt: {"code", "text"}."""
    import gin

    from t5lite.infer import predict
    gin.clear_config()
    gin.parse_config(f"vocabulary.kind = {args.vocabulary_kind!r}")
    prompts = [code for code in CODES for _ in range(args.samples)]
    records = predict.infer(prompts, checkpoint_path=args.control_lm, method="sample",
                            max_decode_length=args.max_decode_length, temperature=args.temperature, top_k=args.top_k,
                            repetition_penalty=args.repetition_penalty, seed=args.seed, batch_size=64,
                            max_input_length=8, progress=False)
    generations = [{"code": r["input"], "text": " ".join(r["prediction"].split())} for r in records]
    gin.clear_config()
    return generations


def classify(args, generations: list[dict]) -> list[int]:
    """The classifier's class of each generation: `t5lite eval` of `--classifier` on them as an
    SST-2 dev set, each labelled with its code."""
    import gin

    from t5lite import cli
    data = os.path.join(args.out, "generated")   # the first thing written under --out
    os.makedirs(os.path.join(data, "SST-2"), exist_ok=True)
    with open(os.path.join(data, "SST-2", "dev.tsv"), "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\")
        writer.writerow(["sentence", "label"])
        writer.writerows([g["text"], CODES.index(g["code"])] for g in generations)
    evaluated = os.path.join(args.out, "eval")
    gin.clear_config()
    cli.main(["eval", f"--gin_file={args.classifier_gin}", f"--gin.CHECKPOINT_PATH='{args.classifier}'",
              f"--gin.DATA_DIR='{data}'", f"--gin.eval.output_dir='{evaluated}'"])
    gin.clear_config()
    with open(os.path.join(evaluated, "bert_glue_sst2.validation", "predictions.jsonl")) as f:
        return [int(json.loads(line)["prediction"]) for line in f]


def agreement(generations: list[dict]) -> dict[str, dict]:
    """Per code: the generations, how many the classifier put in the code's class, the share and its
    95% interval."""
    out = {}
    for code in CODES:
        classes = [g["class"] for g in generations if g["code"] == code]
        agree = classes.count(code)
        low, high = wilson_interval(agree, len(classes))
        out[code] = {"samples": len(classes), "agree": agree, "agreement": agree / len(classes),
                     "interval95": [low, high]}
    return out


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    codes = list(result["codes"])
    shares = [100 * result["codes"][c]["agreement"] for c in codes]
    errors = [[s - 100 * result["codes"][c]["interval95"][0] for s, c in zip(shares, codes)],
              [100 * result["codes"][c]["interval95"][1] - s for s, c in zip(shares, codes)]]
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.bar(codes, shares, yerr=errors, capsize=6, color=["#c0504d", "#4f81bd"])
    ax.axhline(50, color="gray", linestyle="--", linewidth=1, label="chance (50%)")
    ax.set_ylim(0, 100)
    ax.set_xlabel("control code of the prompt")
    ax.set_ylabel("classified as the code's class (%)")
    ax.set_title(f"{result['samples']} generations per code, 95% intervals", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def measure(args) -> dict:
    from t5lite.errors import require_positive
    from t5lite.infer import checkpoint_reader
    require_positive({"--samples": args.samples, "--max_decode_length": args.max_decode_length})
    for run, command in ((args.control_lm, "infer"), (args.classifier, "eval")):   # before any work
        checkpoint_reader.step_directory(run)
        checkpoint_reader.require_command_takes(run, command)
    generations = generate(args)
    for g, label in zip(generations, classify(args, generations)):
        g["class"] = CODES[label]
    with open(os.path.join(args.out, "generations.jsonl"), "w") as f:
        f.writelines(json.dumps(g) + "\n" for g in generations)
    settings = {k: v for k, v in vars(args).items() if k not in ("control_lm", "classifier", "out")}
    return {"args": settings, "samples": args.samples, "codes": agreement(generations)}


def main(argv=None) -> None:
    from t5lite import cli
    from t5lite.errors import T5liteError
    args = _args(argv)
    cli.configure_jax()
    try:
        result = measure(args)
    except T5liteError as e:
        print(f"control_codes.py: error: {cli.user_message(e)}", file=sys.stderr)
        raise SystemExit(2) from None
    with open(os.path.join(args.out, "control_codes.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.join(args.out, "control_codes.png"))
    print("| code | generations | classified as the code | agreement | 95% interval |\n|---|---|---|---|---|")
    for code, row in result["codes"].items():
        low, high = row["interval95"]
        print(f"| {code} | {row['samples']} | {row['agree']} | {100 * row['agreement']:.1f}% | "
              f"{100 * low:.1f}–{100 * high:.1f}% |")


if __name__ == "__main__":
    main()
