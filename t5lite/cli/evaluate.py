"""`t5lite eval` (a module named so as not to shadow the builtin `eval`)."""
from __future__ import annotations

import argparse

from t5lite import gin_checks
from t5lite.cli.gin_flags import check_task_name, from_training_config, model_from_run_unless_given, parse_gin
from t5lite.errors import CheckpointError, ConfigError, T5liteError


def add_parser(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `t5lite eval` subcommand: gin flags only."""
    parser = subparsers.add_parser("eval", parents=[common],
                                   help="evaluate a checkpoint on a task split (gin: MODEL_DIR for its latest "
                                        "checkpoint or CHECKPOINT_PATH, MIXTURE_OR_TASK_NAME, eval.split, "
                                        "eval.data_dir, eval.output_dir)")
    parser.add_argument("--forgetting", action="store_true",
                        help="CHECKPOINT_PATH is a fine-tuned run and the gin files its base's pre-training config: "
                             "score the base and the run (its weights in the base's model, the base's pre-training "
                             "head kept) on the base's task, side by side (docs/guides/forgetting.md)")
    parser.add_argument("--forgetting_base", metavar="BASE_RUN", default=None,
                        help="with --forgetting: the run it was fine-tuned from (default: the one its PEFT record or "
                             "config.gin names)")
    parser.set_defaults(fn=cmd_eval)


def cmd_eval(args, gin_files, gin_bindings) -> None:
    from t5lite.infer.evaluation import evaluate
    try:
        parse_gin(gin_files, gin_bindings, required_macros=(), entry=("eval", evaluate), base_file="gin/eval.gin")
    except ConfigError as e:
        _refuse_other_model(e)
        raise
    model_from_run_unless_given("eval")
    from_training_config("eval", ("objective", "data_dir"))
    check_task_name("eval")
    from t5lite.train import cost
    meter = cost.CostMeter(None)   # this call's cost, written to the eval folder's cost.json
    if args.forgetting or args.forgetting_base:
        return _forgetting(args.forgetting_base, evaluate, meter)
    metrics = evaluate(meter=meter)
    print("metrics:", " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    print("cost (estimated):", cost.summary(meter.totals()))


def _forgetting(base: str | None, evaluate, meter) -> None:
    """`t5lite eval --forgetting`: the base and the fine-tuned run (CHECKPOINT_PATH) on the base's task,
    each metric side by side with its change; also written to the run's eval/forgetting.json."""
    import gin
    from t5lite import finite
    from t5lite.infer import forgetting
    from t5lite.run_layout import RunDir
    from t5lite.train import cost
    run = gin.query_parameter("%CHECKPOINT_PATH")
    base = base or forgetting.base_of(run)
    kept = forgetting.kept_from_base(base, run)
    before = evaluate(checkpoint_path=base, meter=meter)
    after = evaluate(checkpoint_path=base, weights_of=run, meter=meter)
    task = gin.query_parameter("%MIXTURE_OR_TASK_NAME")
    split = gin.query_parameter("eval.split") if gin_checks.is_bound("eval.split") else "validation"
    print(f"forgetting of {run} on {task} ({split}), base {base}:")
    for key in before:
        print(f"  {key:<16} base {before[key]:.4g}  fine-tuned {after[key]:.4g}  change {after[key] - before[key]:+.4g}")
    if kept:
        print(f"  from the base (the run has none): {', '.join(kept)}")
    folder = RunDir(forgetting.run_of(run)).evaluations
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "forgetting.json").write_text(finite.dumps(finite.null_non_finite(
        {"run": run, "base": base, "task": task, "split": split, "base_metrics": before, "run_metrics": after,
         "from_base": kept}), indent=1))
    print("cost (estimated):", cost.summary(meter.totals()))


def _refuse_other_model(error: ConfigError) -> None:
    """Without a task, eval of a run that is not a transformer's (an ELMo or word2vec run, say) says
    what the run is and what reads it, rather than which gin macros are missing alone."""
    import gin
    from t5lite.infer import checkpoint_reader
    try:
        path = gin.query_parameter("%CHECKPOINT_PATH")
        other = checkpoint_reader.other_model(path) if isinstance(path, str) else None
    except (ValueError, T5liteError):   # no checkpoint given, or none there: the error itself says enough
        return
    checkpoint_reader.require_command_takes(path, "eval")
    if other is not None:
        raise CheckpointError(f"{path} is {other[0]}: {error}; read it with "
                              f"{checkpoint_reader.commands_taking(other)}") from error
