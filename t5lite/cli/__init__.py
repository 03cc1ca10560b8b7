"""`t5lite` command line: train | eval | infer | embed | convert | tasks | prepare | compile | probe | attention.

Gin flags follow T5X: `--gin_file=F` (repeatable) and `--gin.NAME=VALUE` (a gin binding, so
strings need inner quotes: `--gin.MODEL_DIR="'/tmp/run'"`). `eval` and `infer` read
gin/eval.gin or gin/infer.gin first, so a training config serves them as it is:

    t5lite eval --gin_file=configs/local/t5_tiny_finetune_sst2.gin --gin.MODEL_DIR="'/tmp/ft'"
    t5lite infer --gin_file=configs/local/t5_tiny_pretrain.gin --gin.CHECKPOINT_PATH="'/tmp/pt'" "some text"
"""
# The docstring above is `t5lite --help`'s description. Each command is a module of this package
# (cmd_<name>); gin_flags and inputs hold what several commands share; here are the parser and main().
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from t5lite import platforms
from t5lite.cli.analysis import cmd_attention, cmd_probe
from t5lite.cli.convert import cmd_convert
from t5lite.cli.embed import cmd_embed
from t5lite.cli.evaluate import cmd_eval
from t5lite.cli.gin_flags import REPO_ROOT, check_task_name, parse_gin, split_gin_flags
from t5lite.cli.infer import cmd_infer
from t5lite.cli.inputs import get_task_or_mixture, read_inputs
from t5lite.cli.prepare import cmd_prepare
from t5lite.cli.sweep import cmd_sweep
from t5lite.cli.tasks import cmd_tasks, parse_lengths
from t5lite.cli.tpu_compile import cmd_compile
from t5lite.cli.train import cmd_train
from t5lite.errors import T5liteError

# What is imported from t5lite.cli: the console script's main() and the pieces tests call.
__all__ = ["REPO_ROOT", "build_parser", "check_task_name", "get_task_or_mixture", "main", "parse_gin", "parse_lengths",
           "read_inputs", "split_gin_flags", "user_message"]


def _add_text_inputs(parser: argparse.ArgumentParser, text_help: str) -> None:
    """The input flags `t5lite infer` and `t5lite embed` share: texts, or a file of them."""
    parser.add_argument("text", nargs="*", help=text_help)
    parser.add_argument("--input_file", default=None,
                        help="a UTF-8 file with one input text per line, or JSON lines (.jsonl or --field)")
    parser.add_argument("--field", default=None, help="the input field of JSON lines (default: input)")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="show the traceback of t5lite's own errors too (or set T5LITE_DEBUG=1)")
    parser = argparse.ArgumentParser(prog="t5lite", description=__doc__, parents=[common],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", parents=[common],
                           help="train or resume a model (gin flags: --gin_file, --gin.NAME=VALUE)")
    train.add_argument("--prune_heads", type=float, default=None, metavar="FRACTION",
                       help="prune this fraction of the attention heads, least important first (Michel et al.), "
                            "from the starting params: train.pruning=@HeadPruning() with HeadPruning.fraction")
    train.set_defaults(fn=cmd_train)
    evaluate = sub.add_parser("eval", parents=[common],
                              help="evaluate a checkpoint on a task split (gin: MODEL_DIR for its latest "
                                   "checkpoint or CHECKPOINT_PATH, MIXTURE_OR_TASK_NAME, eval.split, "
                                   "eval.data_dir, eval.output_dir)")
    evaluate.set_defaults(fn=cmd_eval)
    infer = sub.add_parser("infer", parents=[common],
                           help="decode texts with a checkpoint, JSON lines out (gin: CHECKPOINT_PATH, "
                                "infer.method; gin/infer.gin)")
    _add_text_inputs(infer, "input texts, e.g. \"sst2 sentence: a fine film\"")
    infer.add_argument("--output", default=None, help="write the JSON lines to this file instead of stdout")
    infer.set_defaults(fn=cmd_infer)
    embed = sub.add_parser("embed", parents=[common],
                           help="sentence embeddings of texts with an encoder's checkpoint, .npy out (gin: "
                                "CHECKPOINT_PATH, embed.pooling, embed.normalize; gin/embed.gin)")
    _add_text_inputs(embed, "input texts")
    embed.add_argument("--output", required=True, help="the .npy file to write: [inputs, dim] float32, in input order")
    embed.set_defaults(fn=cmd_embed)
    convert = sub.add_parser("convert", parents=[common], help="Hugging Face folder <-> t5lite checkpoint")
    convert.add_argument("--from_hf", help="a Hugging Face model folder (config.json + weights) to import")
    convert.add_argument("--to_hf", help="a t5lite run directory (or step directory) to export")
    convert.add_argument("--out", required=True, help="the directory to write: new or empty (never overwritten)")
    convert.add_argument("--peft_adapter", default=None,
                         help="with --from_hf: a peft LoRA adapter folder (adapter_config.json + "
                              "adapter_model.safetensors) to merge into the imported base, or a prefix- or "
                              "prompt-tuning one: OUT is then a PEFT run on OUT/base")
    convert.add_argument("--merge", default=None,
                         help="a PEFT run directory to write as a plain full checkpoint (LoRA merged into its base)")
    convert.add_argument("--preset", default=None, help="model preset, for runs without model_config.json")
    convert.add_argument("--quantize", default=None, choices=["int8", "int4"],
                         help="write a weight-only quantised run (int8: kernels and tables with per-output-channel "
                              "scales; int4: packed int4 kernels, scales per 128 inputs) of --from_hf HF_DIR or "
                              "--from_run RUN_DIR")
    convert.add_argument("--from_run", default=None, help="with --quantize: a t5lite run directory to quantise")
    convert.add_argument("--from_elmo", default=None, help="an original ELMo weights .hdf5 to import as a t5lite run")
    convert.add_argument("--elmo_options", default=None, help="with --from_elmo: its options.json")
    convert.add_argument("--to_elmo", default=None,
                         help="a t5lite ELMo run to write as OUT/options.json + OUT/weights.hdf5")
    convert.set_defaults(fn=cmd_convert)
    tasks = sub.add_parser("tasks", parents=[common], help="list tasks or show preprocessed examples of one")
    tasks.add_argument("action", choices=["list", "show"])
    tasks.add_argument("name", nargs="?")
    tasks.add_argument("--split", default="train")
    tasks.add_argument("--data_dir", default=None)
    tasks.add_argument("-n", "--num_examples", type=int, default=3)
    tasks.add_argument("--sequence_length", default="inputs=512,targets=114",
                       help="feature lengths for preprocessing, e.g. inputs=512,targets=114")
    tasks.set_defaults(fn=cmd_tasks)
    prep = sub.add_parser("prepare", parents=[common],
                          help="clean and de-duplicate raw text (C4's rules) into ArrayRecord shards + manifest.json")
    prep.add_argument("--input", nargs="+", required=True,
                      help="files or globs: JSON lines with `text` (and `url`), or plain text (one document per "
                           "file); .gz is decompressed, e.g. 'crawl/*.jsonl.gz'")
    prep.add_argument("--output", required=True, help="a new or empty folder (or an unfinished one, to resume)")
    prep.add_argument("--workers", type=int, default=1, help="worker processes (one input file at a time each)")
    prep.add_argument("--split", default="train", help="the split name the shards and manifest carry")
    prep.add_argument("--bad_words", default=None, help="a file of words or phrases, one per line: pages with one go")
    prep.add_argument("--min_words", type=int, help="words a line needs to be kept (default C4's 5)")
    prep.add_argument("--min_sentences", type=int, help="sentences a page needs to be kept (default C4's 3)")
    prep.add_argument("--max_page_length", type=int,
                      help="pages with more characters go (default C4's 190000)")
    prep.add_argument("--no_language_filter", action="store_true", help="keep pages in any language")
    prep.set_defaults(fn=cmd_prepare)
    compile_ = sub.add_parser("compile", parents=[common], help="compile the train step (or infer's decoding) for a TPU slice on "
                                              "this machine: memory, FLOPs, collectives (needs the `tpu` extra)")
    compile_.add_argument("--mode", choices=["train", "infer"], default="train",
                          help="train: `t5lite train`'s step (gin as for train); infer: `t5lite infer`'s decoding "
                               "of one batch (gin: infer.model, infer.batch_size, infer.max_input_length, "
                               "infer.max_decode_length, infer.method)")
    compile_.add_argument("--topology", required=True,
                          help="TPU slice: a shape (v5e:2x2, v5e:4x4, v4:2x2x4) or an accelerator type (v4-32, v5p-64)")
    compile_.add_argument("--num_slices", type=int, default=1, help="slices joined over DCN (data axis)")
    compile_.set_defaults(fn=cmd_compile)
    analysis = argparse.ArgumentParser(add_help=False)
    analysis.add_argument("--model", required=True,
                          help="a Hugging Face model folder (config.json + weights + tokenizer) or a t5lite run / "
                               "checkpoint directory")
    analysis.add_argument("--vocabulary", default=None,
                          help="the model's vocabulary file, if its folder or run does not record one")
    analysis.add_argument("--name", default=None, help="the model's name in the results (default: its folder's)")
    analysis.add_argument("--data_dir", default=None,
                          help="the folder with en_ewt/*.conllu (UD English-EWT) and uner_en_ewt/*.iob2")
    analysis.add_argument("--out", required=True, help="the folder to write the JSON and PNG into")
    probe = sub.add_parser("probe", parents=[common, analysis],
                           help="per-layer linear (POS, NER) and structural (dependency distance) probes of a frozen "
                                "model against its untrained control; or, with --neighbours, a word's contextual "
                                "nearest neighbours")
    probe.add_argument("--probes", default="pos,structural",
                       help="comma-separated: pos, ner, ner_spans (entity type of each gold span), structural")
    probe.add_argument("--span_pooling", default="mean", choices=["mean", "endpoint"],
                       help="ner_spans: a span's vector is its subwords' mean or [first; last]")
    probe.add_argument("--train_sentences", type=int, default=500, help="sentences the probes train on")
    probe.add_argument("--test_sentences", type=int, default=200, help="sentences the probes are scored on")
    probe.add_argument("--rank", type=int, default=32, help="the structural probe's rank k")
    probe.add_argument("--epochs", type=int, default=30, help="the structural probe's epochs")
    probe.add_argument("--l2", type=float, default=1e-3, help="the linear probes' L2 weight")
    probe.add_argument("--no_control", action="store_true", help="skip the untrained control model")
    probe.add_argument("--seed", type=int, default=0, help="the control's initialisation and the probes' seed")
    probe.add_argument("--neighbours", default=None, metavar="WORD",
                       help="instead of probing: each occurrence of WORD in --corpus and its nearest neighbours")
    probe.add_argument("--corpus", default=None,
                       help="with --neighbours: a CoNLL-U file or plain text (sentences cut after . ! ?)")
    probe.add_argument("--corpus_sentences", type=int, default=None, help="with --neighbours: read only this many")
    probe.add_argument("--layer", type=int, default=-1,
                       help="with --neighbours: the layer (0 = embeddings, negative from the top)")
    probe.add_argument("--k", type=int, default=5, help="with --neighbours: neighbours per occurrence")
    probe.add_argument("--pool", default="same", choices=["same", "all"],
                       help="with --neighbours: among the word's other occurrences, or among all words")
    probe.set_defaults(fn=cmd_probe)
    attention = sub.add_parser("attention", parents=[common, analysis],
                               help="per-head attention statistics (Clark et al. 2019), dependency heads and "
                                    "heatmaps of a frozen model on UD sentences")
    attention.add_argument("--split", default="dev", choices=["train", "dev", "test"], help="the UD split to read")
    attention.add_argument("--sentences", type=int, default=200, help="the first N sentences of the split")
    attention.add_argument("--example", type=int, default=0, help="which of them the heatmaps show")
    attention.set_defaults(fn=cmd_attention)
    sweep = sub.add_parser("sweep", parents=[common], help="run a grid of pre-train + fine-tune cells over seeds "
                                                            "(--gin_file=configs/sweeps/NAME.gin) and report them")
    sweep.add_argument("--out", required=True, help="the sweep's folder: a run directory per cell and seed, report.md")
    sweep.add_argument("--parallel", type=int, default=None,
                       help="cells run at once (default: the scale's `parallel`)")
    sweep.set_defaults(fn=cmd_sweep)
    return parser


def configure_jax() -> None:
    """Compiled programs cached on disk (a resumed or repeated run skips XLA's compile), the CPU alone
    on a machine without accelerators unless JAX_PLATFORMS says otherwise (t5lite.platforms), and on
    a multi-host slice (T5LITE_DISTRIBUTED=1, set by tpu_scripts/run.sh) joining the other hosts."""
    import jax
    from t5lite.data.vocab import default_cache_dir
    chosen = platforms.default_platforms()
    if chosen:
        jax.config.update("jax_platforms", chosen)
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.join(default_cache_dir(), "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    if os.environ.get("T5LITE_DISTRIBUTED") == "1":
        jax.distributed.initialize()


def main(argv: list[str] | None = None) -> None:
    """Runs a command. A `T5liteError` (the user's input at fault) prints as one message with exit
    code 2, its traceback only with --debug or T5LITE_DEBUG=1; anything else is a bug and keeps its
    traceback (exit code 1)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or os.environ.get("T5LITE_DEBUG", "") not in ("", "0")
    try:
        gin_files, gin_bindings, rest = split_gin_flags(argv)
        args = build_parser().parse_args(rest)
        configure_jax()
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for noisy in ("absl", "orbax", "jax", "fsspec", "gcsfs"):  # gcsfs: gs:// paths without TensorFlow
            logging.getLogger(noisy).setLevel(logging.WARNING)
        args.fn(args, gin_files, gin_bindings)
    except T5liteError as e:
        if debug:
            traceback.print_exc()
        print(f"t5lite: error: {user_message(e)}", file=sys.stderr)
        raise SystemExit(2) from None


def user_message(error: BaseException) -> str:
    """The error's message without the "In call to configurable ..." lines gin appends."""
    return "\n".join(line for line in str(error).splitlines()
                     if not line.strip().startswith("In call to configurable")).strip()
