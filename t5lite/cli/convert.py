"""`t5lite convert`: Hugging Face, PEFT and ELMo weights to and from t5lite runs, and quantised runs."""
from __future__ import annotations

import argparse
import os

from t5lite.errors import ConfigError
from t5lite.run_layout import RunDir


def add_parser(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `t5lite convert` subcommand and its flags."""
    parser = subparsers.add_parser("convert", parents=[common], help="Hugging Face folder <-> t5lite checkpoint")
    parser.add_argument("--from_hf", help="a Hugging Face model folder (config.json + weights) to import")
    parser.add_argument("--to_hf", help="a t5lite run directory (or step directory) to export")
    parser.add_argument("--out", required=True, help="the directory to write: new or empty (never overwritten)")
    parser.add_argument("--peft_adapter", default=None,
                        help="with --from_hf: a peft adapter folder (adapter_config.json + "
                             "adapter_model.safetensors; LoRA, prefix or prompt tuning) for that base: OUT is "
                             "then a PEFT run of it on OUT/base (--merge it for a plain checkpoint)")
    parser.add_argument("--merge", default=None,
                        help="a PEFT run directory to write as a plain full checkpoint (LoRA merged into its base)")
    parser.add_argument("--preset", default=None, help="model preset, for runs without model_config.json")
    parser.add_argument("--quantize", default=None, choices=["int8", "int4"],
                        help="write a weight-only quantised run (int8: kernels and tables with per-output-channel "
                             "scales; int4: torchao's Int4WeightOnlyConfig, packed int4 kernels with a scale and zero point "
                             "per 128 inputs) of --from_hf HF_DIR or "
                             "--from_run RUN_DIR")
    parser.add_argument("--from_run", default=None, help="with --quantize: a t5lite run directory to quantise")
    parser.add_argument("--from_elmo", default=None, help="an original ELMo weights .hdf5 to import as a t5lite run")
    parser.add_argument("--elmo_options", default=None, help="with --from_elmo: its options.json")
    parser.add_argument("--to_elmo", default=None,
                        help="a t5lite ELMo run to write as OUT/options.json + OUT/weights.hdf5")
    parser.set_defaults(fn=cmd_convert)


def _check_quantize_flags(args) -> None:
    if args.peft_adapter:
        raise ConfigError("t5lite convert --quantize: --peft_adapter is not quantised; import the adapter with "
                          "--from_hf BASE --peft_adapter DIR --out RUN, write it merged with --merge RUN --out FULL, "
                          "then quantise that with --from_run FULL")
    if bool(args.from_hf) == bool(args.from_run) or args.to_hf or args.merge:
        raise ConfigError(f"t5lite convert --quantize {args.quantize}: give exactly one source, --from_hf HF_DIR or --from_run "
                          "RUN_DIR, and --out DIR")


def _check_flags(args) -> None:
    if args.quantize:
        return _check_quantize_flags(args)
    if args.from_run:
        raise ConfigError("t5lite convert: --from_run RUN_DIR goes with --quantize int8")
    if sum(map(bool, (args.from_hf, args.to_hf, args.merge, args.from_elmo, args.to_elmo))) != 1:
        raise ConfigError("t5lite convert: give exactly one of --from_hf HF_DIR, --to_hf RUN_DIR, --merge RUN_DIR, "
                          "--from_elmo WEIGHTS_HDF5 or --to_elmo RUN_DIR, and --out DIR")
    if bool(args.from_elmo) != bool(args.elmo_options):
        raise ConfigError("t5lite convert: --from_elmo WEIGHTS_HDF5 needs --elmo_options OPTIONS_JSON (and only it)")
    if args.peft_adapter and not args.from_hf:
        raise ConfigError("t5lite convert: --peft_adapter DIR goes with --from_hf BASE_DIR (the adapter's base)")


def cmd_convert(args, gin_files, gin_bindings) -> None:
    """Writes --out whole or not at all (checkpoint.written_whole), so a failed convert is simply rerun."""
    from t5lite.interop import checkpoint
    _check_flags(args)
    with checkpoint.written_whole(args.out, "--out"):
        message = _convert(args)
    print(message)


def _convert(args) -> str:
    """Writes --out; returns what was written, in words."""
    from t5lite.interop import checkpoint
    if args.quantize:
        config = checkpoint.quantize(args.out, args.quantize, hf_dir=args.from_hf, run_dir=args.from_run)
        return (f"wrote the {args.quantize} weight-only quantised run {args.out} ({config.arch}); every command loads "
                "it, fine-tuning from it dequantises it")
    if args.from_hf:
        config = checkpoint.hf_to_t5lite(args.from_hf, args.out, args.peft_adapter)
        if RunDir(args.out).peft.exists():
            return (f"wrote the PEFT run {args.out} on the imported base {os.path.join(args.out, 'base')}; train it "
                    "further, evaluate or infer with the run, or write it merged with --merge")
        return (f"wrote t5lite checkpoint {args.out} ({config.arch}); fine-tune from it with "
                f"--gin.INITIAL_CHECKPOINT_PATH=\"'{args.out}'\"")
    if args.from_elmo or args.to_elmo:
        return _convert_elmo(args)
    if args.merge:
        checkpoint.merge_peft_run(args.merge, args.out)
        return f"wrote the merged full checkpoint {args.out}"
    checkpoint.t5lite_to_hf(args.to_hf, args.out, preset=args.preset)
    return f"wrote Hugging Face folder {args.out}"


def _convert_elmo(args) -> str:
    from t5lite.interop import elmo
    if args.from_elmo:
        elmo.to_run(args.elmo_options, args.from_elmo, args.out)
        return f"wrote t5lite ELMo run {args.out}; use it with --gin.INITIAL_CHECKPOINT_PATH=\"'{args.out}'\""
    elmo.from_run(args.to_elmo, os.path.join(args.out, "options.json"), os.path.join(args.out, "weights.hdf5"))
    return f"wrote {args.out}/options.json and {args.out}/weights.hdf5"
