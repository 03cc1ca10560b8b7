"""`t5lite compile` (a module named so as not to shadow the builtin `compile`)."""
from __future__ import annotations

from t5lite.cli.gin_flags import parse_gin


def cmd_compile(args, gin_files, gin_bindings) -> None:
    from t5lite.train.tpu_compile import compile_decode_from_gin, compile_from_gin
    if args.mode == "infer":
        parse_gin(gin_files, gin_bindings + ["CHECKPOINT_PATH = None"], required_macros=(),
                  base_file="gin/infer.gin")
    else:
        parse_gin(gin_files, gin_bindings + ["MODEL_DIR = None"],
                  required_macros=("BATCH_SIZE", "TASK_FEATURE_LENGTHS"))
    report = (compile_decode_from_gin if args.mode == "infer" else compile_from_gin)(args.topology, args.num_slices)
    print(report.format())
    if not report.fits:
        raise SystemExit(2)
