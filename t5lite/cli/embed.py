"""`t5lite embed`."""
from __future__ import annotations

import argparse

from t5lite import writable
from t5lite.cli.gin_flags import from_training_config, model_from_run_unless_given, parse_gin
from t5lite.cli.inputs import add_text_inputs, input_texts


def add_parser(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `t5lite embed` subcommand and its flags."""
    parser = subparsers.add_parser("embed", parents=[common],
                                   help="sentence embeddings of texts with an encoder's checkpoint, .npy out (gin: "
                                        "CHECKPOINT_PATH, embed.pooling, embed.normalize; gin/embed.gin)")
    add_text_inputs(parser, "input texts")
    parser.add_argument("--output", required=True, help="the .npy file to write (.npy is added if missing; local or gs://): [inputs, dim] float32, "
                             "in input order")
    parser.set_defaults(fn=cmd_embed)


def cmd_embed(args, gin_files, gin_bindings) -> None:
    import numpy as np
    from etils import epath

    from t5lite.infer.embedding import embed
    texts = input_texts(args, "embed", "text")
    output = args.output if args.output.endswith(".npy") else args.output + ".npy"   # the name numpy.save gives it
    writable.ensure_writable_file(output, "--output")
    parse_gin(gin_files, gin_bindings, required_macros=(), entry=("embed", embed), base_file="gin/embed.gin")
    model_from_run_unless_given("embed")
    from_training_config("embed")
    embeddings = embed(texts)
    with epath.Path(output).open("wb") as f:   # a local path or gs://
        np.save(f, embeddings)
    print(f"wrote {embeddings.shape[0]} embeddings of dimension {embeddings.shape[1]} to {output}")
