"""`t5lite infer`."""
from __future__ import annotations

import argparse

from t5lite import finite, writable
from t5lite.cli.gin_flags import model_from_run_unless_given, parse_gin
from t5lite.cli.inputs import add_text_inputs, input_texts


def add_parser(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `t5lite infer` subcommand and its flags."""
    parser = subparsers.add_parser("infer", parents=[common],
                                   help="decode texts with a checkpoint, JSON lines out (gin: CHECKPOINT_PATH, "
                                        "infer.method; gin/infer.gin)")
    add_text_inputs(parser, "input texts, e.g. \"sst2 sentence: a fine film\"")
    parser.add_argument("--output", default=None, help="write the JSON lines to this file instead of stdout")
    parser.set_defaults(fn=cmd_infer)


def cmd_infer(args, gin_files, gin_bindings) -> None:
    from t5lite.infer.evaluation import write_predictions
    from t5lite.infer.predict import infer
    texts = input_texts(args, "decode", "input")
    if args.output:
        writable.ensure_writable_file(args.output, "--output")
    parse_gin(gin_files, gin_bindings, required_macros=(), entry=("infer", infer), base_file="gin/infer.gin")
    model_from_run_unless_given("infer")
    records = infer(texts)
    if not args.output:
        for record in records:
            print(finite.dumps(record, ensure_ascii=False), flush=True)
        return
    write_predictions(args.output, records)
    print(f"wrote {len(texts)} predictions to {args.output}")
