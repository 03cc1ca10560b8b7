"""Params that no gradient trains but each training step moves (BatchNorm's running mean and
variance): a module sows their new values in the `running_statistics` collection during the
training forward pass; the objective returns them and the trainer writes them over the step's
params."""
from __future__ import annotations

from typing import Any

from flax import traverse_util

from t5lite.errors import ConfigError

RUNNING_STATISTICS = "running_statistics"


def sown_values(collection: Any) -> dict:
    """The sown collection ({module path: {name: (value,)}}) as a params-shaped subtree of values."""
    flat = traverse_util.flatten_dict(dict(collection))
    return traverse_util.unflatten_dict({path: values[-1] for path, values in flat.items()})


def with_running_statistics(params: Any, statistics: Any) -> Any:
    """`params` with the leaves that `statistics` (a subtree of the same paths) holds replaced."""
    flat = traverse_util.flatten_dict(dict(params))
    for path, value in traverse_util.flatten_dict(dict(statistics)).items():
        if path not in flat:
            raise ConfigError(f"running statistic {'/'.join(path)} is not among the trained params (a PEFT run "
                              "trains only its method's): train this model without train.peft")
        flat[path] = value.astype(flat[path].dtype)
    return traverse_util.unflatten_dict(flat)
