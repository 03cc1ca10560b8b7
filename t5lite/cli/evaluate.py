"""`t5lite eval` (a module named so as not to shadow the builtin `eval`)."""
from __future__ import annotations

import argparse

from t5lite.cli.gin_flags import check_task_name, model_from_run_unless_given, objective_from_training_config, parse_gin
from t5lite.errors import CheckpointError, ConfigError, T5liteError


def add_parser(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `t5lite eval` subcommand: gin flags only."""
    parser = subparsers.add_parser("eval", parents=[common],
                                   help="evaluate a checkpoint on a task split (gin: MODEL_DIR for its latest "
                                        "checkpoint or CHECKPOINT_PATH, MIXTURE_OR_TASK_NAME, eval.split, "
                                        "eval.data_dir, eval.output_dir)")
    parser.set_defaults(fn=cmd_eval)


def cmd_eval(args, gin_files, gin_bindings) -> None:
    from t5lite.infer.evaluation import evaluate
    try:
        parse_gin(gin_files, gin_bindings, required_macros=(), entry=("eval", evaluate), base_file="gin/eval.gin")
    except ConfigError as e:
        _refuse_other_model(e)
        raise
    model_from_run_unless_given("eval")
    objective_from_training_config()
    check_task_name("eval")
    from t5lite.train import cost
    meter = cost.CostMeter(None)   # this call's cost, written to the eval folder's cost.json
    metrics = evaluate(meter=meter)
    print("metrics:", " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
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
