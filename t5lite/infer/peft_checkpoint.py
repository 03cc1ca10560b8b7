"""A PEFT run's checkpoint holds only the trained parameters, so `MODEL_DIR/peft.json` records the
method and which base they belong to (the base checkpoint's path and a fingerprint of its
params). Resuming, evaluating or inferring on another base is refused with both named; reading
the run gives the base with the method applied (LoRA merged). On the infer floor because
training, evaluation, inference and conversion all read it."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite import storage
from t5lite.errors import CheckpointError, ConfigError, first_line
from t5lite.infer import checkpoint_reader
from t5lite.models import peft
from t5lite.run_layout import RunDir


def fingerprint(params) -> str:
    """A short hash of the base params: per leaf its shape, dtype and two wrapping uint32 sums of
    its bits (plain and position-weighted), computed where the params live. Integer sums are exact
    in any order, so the same params give the same fingerprint on any mesh or host count, and only
    two numbers per leaf come to the host. A task head's None placeholder adds nothing, so a
    backbone graft hashes like its base."""
    leaves = jax.tree.leaves(params)
    sums = jax.device_get(jax.jit(lambda xs: [_bit_sums(x) for x in xs])(leaves))
    digest = hashlib.sha256()
    for leaf, pair in zip(leaves, sums):
        digest.update(f"{tuple(leaf.shape)}{leaf.dtype}{np.asarray(pair).tolist()}".encode())
    return digest.hexdigest()[:16]


def _bit_sums(x):
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32).ravel()
    weights = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(1)
    return jnp.stack([jnp.sum(bits, dtype=jnp.uint32), jnp.sum(bits * weights, dtype=jnp.uint32)])


_RECORD_FIELDS = ("method", "config", "base_checkpoint", "base_fingerprint")


def read(run_dir: str) -> dict | None:
    """The run's peft.json (None for a run without one), refused in one line when it is not what
    the run wrote: not JSON, a field missing, or a method or config t5lite does not build."""
    path = RunDir(run_dir).peft
    if not path.exists():
        return None
    put_back = "put back the file the run wrote"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise CheckpointError(f"{path} is not text; {put_back}") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: line {e.lineno}: not valid JSON ({e.msg}); {put_back}") from None
    missing = [f for f in _RECORD_FIELDS if f not in record] if isinstance(record, dict) else list(_RECORD_FIELDS)
    if missing:
        raise CheckpointError(f"{path} has no {', '.join(missing)}; {put_back}")
    if record["method"] not in peft.METHODS:
        raise CheckpointError(f"{path}: method {record['method']!r} is not a PEFT method t5lite has "
                              f"({', '.join(peft.METHODS)}); {put_back}")
    try:
        method_of(record)
    except (TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{path}: its {record['method']} config does not build ({first_line(e)}); "
                              f"{put_back}") from None
    return record


def method_of(record: dict) -> peft.Method:
    fields = {k: tuple(tuple(t) if isinstance(t, list) else t for t in v) if isinstance(v, list) else v
              for k, v in record["config"].items()}
    return peft.METHODS[record["method"]](**fields)


def _refuse_other_base(run_dir: str, stored: dict, base_path: str, base_fingerprint: str):
    if stored["base_fingerprint"] != base_fingerprint:
        raise CheckpointError(
            f"{run_dir} holds PEFT parameters trained on the base {stored['base_checkpoint']} (fingerprint "
            f"{stored['base_fingerprint']}), but the base given is {storage.absolute(base_path)} (fingerprint "
            f"{base_fingerprint}); use the original base (train.initial_checkpoint_path), or a new MODEL_DIR")


def check_or_record(model_dir: str, method, base_path: str | None, base_params, resuming: bool) -> dict:
    """Writes `peft.json` for a new run; for a resumed one, refuses a different base."""
    if not base_path:
        raise ConfigError(f"train.peft={type(method).__name__}(...) trains on a frozen base: set "
                          "train.initial_checkpoint_path to the base checkpoint (a t5lite run or `t5lite convert` "
                          "output)")
    record = {"method": type(method).__name__, "config": dataclasses.asdict(method),
              "base_checkpoint": checkpoint_reader.step_directory(base_path),
              "base_fingerprint": fingerprint(base_params), "base_params": _param_paths(base_params)}
    stored = read(model_dir) if resuming else None
    if stored is not None:
        _refuse_other_base(model_dir, stored, base_path, record["base_fingerprint"])
        return stored
    if jax.process_index() == 0:
        RunDir(model_dir).peft.write_text(json.dumps(record, indent=2))
    return record


def restore_merged(step_dir: str, run_dir: str, record: dict, abstract_params):
    """The model params of a PEFT run's checkpoint, laid out as `abstract_params` asks: its base
    (checked against the fingerprint) with the trained parameters applied (LoRA merged). A run
    trained with a task head keeps its base under "backbone": asked for `{"backbone", "head"}`
    it gives both, asked for a model alone (an analysis, an embedding) the backbone."""
    if not epath.Path(record["base_checkpoint"]).is_dir():
        raise CheckpointError(f"{run_dir} is a PEFT run: its checkpoint holds only the trained parameters of the base "
                              f"{record['base_checkpoint']}, which is gone; restore that checkpoint (fingerprint "
                              f"{record['base_fingerprint']}) or evaluate a merged copy (`t5lite convert --merge`)")
    trained = restore_trained(step_dir)
    headed = not {"backbone", "head"} <= set(abstract_params) and trained_with_head(trained)
    wanted = {(("backbone",) + p if headed else p): a for p, a in flatten_dict(abstract_params).items()}
    readings = [record["base_params"]] if "base_params" in record else _older_base_params(record, trained)
    base = _restore_base({**record, "base_params": readings[0]}, wanted)
    prints = [fingerprint(unflatten_dict({tuple(p.split("/")): base[tuple(p.split("/"))] for p in names}))
              for names in readings]
    if "base_params" not in record and record["base_fingerprint"] not in prints:
        raise CheckpointError(f"{RunDir(run_dir).peft} predates the base parameter names t5lite records, and no "
                              f"reading of the base {record['base_checkpoint']} gives its fingerprint "
                              f"{record['base_fingerprint']} (the base changed, or the run is older than these "
                              "readings); restore the base it was trained on, or train the run again")
    _refuse_other_base(run_dir, record, record["base_checkpoint"],
                       record["base_fingerprint"] if record["base_fingerprint"] in prints else prints[0])
    sharding = jax.tree.leaves(base)[0].sharding
    if isinstance(sharding, jax.sharding.NamedSharding):   # replicated on the base's mesh, to combine with it
        trained = jax.device_put(trained, jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec()))
    new = {p: np.zeros(a.shape, a.dtype) for p, a in wanted.items() if p not in base}   # a new head: trained
    merged = flatten_dict(method_of(record).combine(unflatten_dict({**base, **new}), trained))
    extra = set(base) - set(wanted)   # read for the fingerprint and the merge only
    merged = {p: x for p, x in merged.items() if p not in extra and (not headed or p[0] == "backbone")}
    return unflatten_dict({(p[1:] if headed else p): x for p, x in merged.items()})


def _older_base_params(record: dict, trained) -> list[list[str]]:
    """The base parameter names an older peft.json (one without `base_params`) may have
    fingerprinted, largest first: all the base checkpoint stores (an ELECTRA base's discriminator),
    laid out as the run's model (a task-head run's under "backbone"), and the same without a stored
    head (one of another task's shape); the fingerprint tells which."""
    stored = flatten_dict(checkpoint_reader.stored_params(record["base_checkpoint"]))
    names = {p[0] for p in stored}
    if trained_with_head(trained) and "backbone" not in names:
        kept = [p for p in stored if p[0] == "discriminator"] or list(stored)
        stored = {("backbone",) + (p[1:] if p[0] == "discriminator" else p): None for p in kept}
    everything = sorted("/".join(p) for p in stored)
    headless = [n for n in everything if not n.startswith("head/")]
    return [everything] + ([headless] if headless != everything else [])


def _param_paths(params) -> list[str]:
    """The base's parameter names ("/"-joined), which the fingerprint covers; a new head's None adds none."""
    return sorted("/".join(p) for p, x in flatten_dict(params).items() if x is not None)


def trained_with_head(trained) -> bool:
    """Whether a PEFT run's trained tree is of a task-head model (LoRA of its backbone, its head)."""
    return any(len(p) > 1 and p[1] in ("backbone", "head") for p in flatten_dict(trained))


def _in_base_checkpoint(path: tuple, stored_names: set) -> tuple:
    """Where the base checkpoint keeps `path` of the run's model: a task-head backbone is the root
    of a plain base and the discriminator of an ELECTRA run; a task-head run keeps it as it is."""
    if path[0] == "backbone" and "backbone" not in stored_names:
        return (("discriminator",) if "discriminator" in stored_names else ()) + path[1:]
    return path


def _restore_base(record: dict, wanted: dict) -> dict:
    """{path: array} of the base checkpoint: the params the run's fingerprint covers and those of
    `wanted` it holds (a new task head, with no counterpart in the base, is left out)."""
    checkpoint = record["base_checkpoint"]
    stored = flatten_dict(checkpoint_reader.stored_params(checkpoint))
    names = {p[0] for p in stored}
    place = lambda p: _in_base_checkpoint(p, names)
    sharding = jax.tree.leaves(wanted)[0].sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
        sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    abstract = {p: a for p, a in wanted.items()
                if p[0] != "head" or tuple(getattr(stored.get(place(p)), "shape", ())) == tuple(a.shape)}
    for name in record.get("base_params", []):
        p = tuple(name.split("/"))
        if p not in abstract and place(p) in stored:
            abstract[p] = jax.ShapeDtypeStruct(tuple(stored[place(p)].shape), stored[place(p)].dtype,
                                               sharding=sharding)
    restored = flatten_dict(checkpoint_reader.restore_params(
        checkpoint, unflatten_dict({place(p): a for p, a in abstract.items()})))
    return {p: restored[place(p)] for p in abstract}


def imported(model_dir: str) -> bool:
    """Whether the run's newest checkpoint holds trained parameters alone (no optimizer state):
    an adapter `t5lite convert --from_hf BASE --peft_adapter DIR` imported, for training to start from."""
    if read(model_dir) is None:
        return False
    try:
        step_dir = checkpoint_reader.step_directory(model_dir)
    except FileNotFoundError:
        return False
    return set(checkpoint_reader.step_reader().metadata(step_dir).item_metadata["state"]) == {"params"}


def start_from_import(model_dir: str, fresh_state):
    """`fresh_state` (a new train state of the run's method) with the imported adapter's
    parameters in place of its fresh ones; a method that does not build them is refused."""
    trained = restore_trained(checkpoint_reader.step_directory(model_dir))
    shapes = lambda tree: {k: tuple(v.shape) for k, v in flatten_dict(tree).items()}
    if shapes(trained) != shapes(fresh_state.params):
        raise ConfigError(f"{model_dir} holds an imported {read(model_dir)['method']} whose parameters train.peft "
                          f"does not build; bind train.peft to the method in {RunDir(model_dir).peft}")
    shardings = jax.tree.map(lambda x: x.sharding, fresh_state.params)
    return fresh_state.replace(params=jax.device_put(trained, shardings))


def restore_trained(step_dir: str):
    """The trained tree of a PEFT run's step directory, as stored (on the first device)."""
    stored = checkpoint_reader.step_reader().metadata(step_dir).item_metadata["state"]["params"]
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), stored)
    return checkpoint_reader.restore_params(step_dir, abstract)
