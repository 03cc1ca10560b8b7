"""`t5lite compile` (a module named so as not to shadow the builtin `compile`)."""
from __future__ import annotations

import argparse

from t5lite.cli.gin_flags import parse_gin
from t5lite.cli.inputs import positive_int


def add_parser(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `t5lite compile` subcommand and its flags."""
    parser = subparsers.add_parser("compile", parents=[common],
                                   help="compile the train step (or infer's decoding) for a TPU slice on this "
                                        "machine: memory, FLOPs, collectives (needs the `tpu` extra)")
    parser.add_argument("--mode", choices=["train", "infer"], default="train",
                        help="train: `t5lite train`'s step (gin as for train); infer: `t5lite infer`'s decoding "
                             "of one batch (gin: infer.model, infer.batch_size, infer.max_input_length, "
                             "infer.max_decode_length, infer.method)")
    parser.add_argument("--topology", required=True,
                        help="TPU slice: a shape (v5e:2x2, v5e:4x4, v4:2x2x4) or an accelerator type (v4-32, v5p-64)")
    parser.add_argument("--num_slices", type=positive_int, default=1, help="slices joined over DCN (data axis)")
    parser.set_defaults(fn=cmd_compile)


def cmd_compile(args, gin_files, gin_bindings) -> None:
    from t5lite.train.tpu_compile import compile_decode_from_gin, compile_from_gin, topology_name
    topology_name(args.topology)   # a malformed --topology is refused before gin is parsed and libtpu loads
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
