"""`t5lite` command line: train | eval | infer | convert | tasks.

Gin flags follow T5X: `--gin_file=F` (repeatable) and `--gin.NAME=VALUE` (a gin binding, so
strings need inner quotes: `--gin.MODEL_DIR="'/tmp/run'"`). `eval` and `infer` read
gin/eval.gin or gin/infer.gin first, so a training config serves them as it is:

    t5lite eval --gin_file=configs/local/t5_tiny_finetune_sst2.gin --gin.CHECKPOINT_PATH="'/tmp/ft'"
    t5lite infer --gin_file=configs/local/t5_tiny_pretrain.gin --gin.CHECKPOINT_PATH="'/tmp/pt'" "some text"
"""
from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
REQUIRED_MACROS = ("MODEL_DIR", "TRAIN_STEPS", "BATCH_SIZE", "TASK_FEATURE_LENGTHS", "MIXTURE_OR_TASK_NAME")


def split_gin_flags(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Pulls `--gin_file` and `--gin.X=Y` out of argv: (files, bindings, remaining args)."""
    files, bindings, rest = [], [], []
    it = iter(argv)
    for arg in it:
        if arg.startswith("--gin_file"):
            value = arg.split("=", 1)[1] if "=" in arg else next(it, None)
            if value is None:
                raise SystemExit("--gin_file needs a value: --gin_file=configs/local/t5_tiny_pretrain.gin")
            files.extend(v for v in value.split(",") if v)
        elif arg.startswith("--gin."):
            if "=" not in arg:
                raise SystemExit(f"{arg}: write gin bindings as --gin.NAME=VALUE")
            name, value = arg[len("--gin."):].split("=", 1)
            bindings.append(f"{name} = {value}")
        else:
            rest.append(arg)
    return files, bindings, rest


def parse_gin(files: list[str], bindings: list[str], required_macros=REQUIRED_MACROS, entry=None,
              base_file: str | None = None) -> None:
    """Parses gin files and bindings; a misspelled name or a missing macro fails here, by name.

    `entry` (gin name, function) adds the macros that entry point's bindings refer to to the
    required ones; `base_file` is read before `files` (the eval / infer wiring).
    """
    import gin
    import t5lite.infer.predict  # noqa: F401  (registers configurables)
    import t5lite.train.optimizers  # noqa: F401
    import t5lite.train.partitioning  # noqa: F401
    import t5lite.train.trainer  # noqa: F401
    for path in (os.getcwd(), str(REPO_ROOT)):
        gin.add_config_file_search_path(path)
    if not files:
        raise SystemExit("no --gin_file given; try --gin_file=configs/local/t5_tiny_pretrain.gin")
    try:
        gin.parse_config_files_and_bindings(([base_file] if base_file else []) + files, bindings,
                                            finalize_config=False)
    except (ValueError, IOError, SyntaxError) as e:
        raise SystemExit(f"gin configuration error: {e}") from None
    required = list(required_macros) + (_referenced_macros(*entry) if entry else [])
    missing = list(dict.fromkeys(m for m in required if not _macro_defined(m)))
    if missing:
        hint = " ".join(f"--gin.{m}=..." for m in missing)
        raise SystemExit(f"missing required gin macro(s) {', '.join(missing)}: set them in a gin file or with {hint}")


def _referenced_macros(name: str, fn) -> list[str]:
    """The macros `name.<parameter> = %MACRO` bindings of an entry point refer to."""
    import gin
    found = []
    for param in inspect.signature(fn).parameters:
        try:
            value = gin.query_parameter(f"{name}.{param}")
        except ValueError:
            continue
        selector = getattr(value, "scoped_selector", "")
        if selector.endswith("/gin.macro"):
            found.append(selector.split("/")[0])
    return found


def _macro_defined(name: str) -> bool:
    import gin
    try:
        gin.query_parameter(f"%{name}")
        return True
    except ValueError:
        return False


def cmd_train(args, gin_files, gin_bindings) -> None:
    import gin
    from t5lite.train.trainer import train
    parse_gin(gin_files, gin_bindings, entry=("train", train))
    metrics = train()
    if metrics:  # empty when the run was already at TRAIN_STEPS (train() says so)
        print("final:", " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    print("model dir:", gin.query_parameter("%MODEL_DIR"))


def cmd_eval(args, gin_files, gin_bindings) -> None:
    from t5lite.infer.evaluation import evaluate
    parse_gin(gin_files, gin_bindings, required_macros=(), entry=("eval", evaluate), base_file="gin/eval.gin")
    metrics = evaluate()
    print("metrics:", " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))


def cmd_infer(args, gin_files, gin_bindings) -> None:
    from t5lite.infer.predict import infer
    texts = list(args.text)
    if args.input_file:
        with open(args.input_file, encoding="utf-8") as f:
            texts.extend(line.rstrip("\n") for line in f if line.strip())
    if not texts:
        raise SystemExit("nothing to decode: give texts as arguments or --input_file=FILE (one input per line)")
    parse_gin(gin_files, gin_bindings, required_macros=(), entry=("infer", infer), base_file="gin/infer.gin")
    for text, prediction in zip(texts, infer(texts)):
        print(json.dumps({"input": text, "prediction": prediction}, ensure_ascii=False))


def cmd_tasks(args, gin_files, gin_bindings) -> None:
    from t5lite.data import registry
    if args.action == "list":
        registry._register_builtin_tasks()
        for name in registry.TaskRegistry.names():
            print(name)
        for name in registry.MixtureRegistry.names():
            print(f"{name} (mixture)")
        return
    if not args.name:
        raise SystemExit("usage: t5lite tasks show NAME [--split S] [--data_dir D] [-n N]")
    from t5lite.data.tasks_show import show_examples
    try:
        task = registry.get_task_or_mixture(args.name)
    except KeyError as e:
        raise SystemExit(e.args[0]) from None
    lengths = dict(kv.split("=") for kv in args.sequence_length.split(",")) if args.sequence_length else None
    lengths = {k: int(v) for k, v in lengths.items()} if lengths else None
    print(task)
    show_examples(task, args.split, args.num_examples, data_dir=args.data_dir, sequence_length=lengths)


def cmd_convert(args, gin_files, gin_bindings) -> None:
    from t5lite.interop import checkpoint
    if bool(args.from_hf) == bool(args.to_hf):
        raise SystemExit("t5lite convert: give exactly one of --from_hf HF_DIR or --to_hf RUN_DIR, and --out DIR")
    if args.from_hf:
        config = checkpoint.hf_to_t5lite(args.from_hf, args.out)
        print(f"wrote t5lite checkpoint {args.out} ({config.arch}); fine-tune from it with "
              f"--gin.INITIAL_CHECKPOINT_PATH=\"'{args.out}'\"")
    else:
        checkpoint.t5lite_to_hf(args.to_hf, args.out, preset=args.preset)
        print(f"wrote Hugging Face folder {args.out}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t5lite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train or resume a model (gin flags: --gin_file, --gin.NAME=VALUE)")
    train.set_defaults(fn=cmd_train)
    evaluate = sub.add_parser("eval", help="evaluate a checkpoint on a task split (gin: CHECKPOINT_PATH, "
                                            "MIXTURE_OR_TASK_NAME, eval.split, eval.data_dir)")
    evaluate.set_defaults(fn=cmd_eval)
    infer = sub.add_parser("infer", help="decode texts with a checkpoint (gin: CHECKPOINT_PATH, infer.method)")
    infer.add_argument("text", nargs="*", help="input texts, e.g. \"sst2 sentence: a fine film\"")
    infer.add_argument("--input_file", default=None, help="a file with one input text per line")
    infer.set_defaults(fn=cmd_infer)
    convert = sub.add_parser("convert", help="Hugging Face folder <-> t5lite checkpoint")
    convert.add_argument("--from_hf", help="a Hugging Face model folder (config.json + weights) to import")
    convert.add_argument("--to_hf", help="a t5lite run directory (or step directory) to export")
    convert.add_argument("--out", required=True, help="the directory to write")
    convert.add_argument("--preset", default=None, help="model preset, for runs without model_config.json")
    convert.set_defaults(fn=cmd_convert)
    tasks = sub.add_parser("tasks", help="list tasks or show preprocessed examples of one")
    tasks.add_argument("action", choices=["list", "show"])
    tasks.add_argument("name", nargs="?")
    tasks.add_argument("--split", default="train")
    tasks.add_argument("--data_dir", default=None)
    tasks.add_argument("-n", "--num_examples", type=int, default=3)
    tasks.add_argument("--sequence_length", default="inputs=512,targets=114",
                       help="feature lengths for preprocessing, e.g. inputs=512,targets=114")
    tasks.set_defaults(fn=cmd_tasks)
    return parser


def configure_jax() -> None:
    """Compiled programs cached on disk (a resumed or repeated run skips XLA's compile), and on a
    multi-host slice (T5LITE_DISTRIBUTED=1, set by tpu_scripts/run.sh) joining the other hosts."""
    import jax
    from t5lite.data.vocab import default_cache_dir
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.join(default_cache_dir(), "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    if os.environ.get("T5LITE_DISTRIBUTED") == "1":
        jax.distributed.initialize()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    gin_files, gin_bindings, rest = split_gin_flags(argv)
    args = build_parser().parse_args(rest)
    configure_jax()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "orbax", "jax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args.fn(args, gin_files, gin_bindings)


if __name__ == "__main__":
    main()
