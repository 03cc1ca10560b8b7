"""Parallelism as data: a device mesh plus rules that map logical axis names onto mesh axes.

Model code names axes (`batch`, `embed`, `mlp`, `heads`, ...); the rules here decide which mesh
axis (`data`, `fsdp`, `model`) shards each one. On each shipped mesh the default rules shard as
T5X's `standard_logical_axis_rules` (t5x/partitioning.py; tests/test_reference_partitioning.py):
data and tensor parallelism as its 1-D parameter partitioning, `fsdp` as its 2-D one with `fsdp`
in the part of T5X's `data`. T5X has one data axis; with both `data` and `fsdp` > 1 the batch
spans both and parameters are split over `fsdp` only. T5X's 2-D activation partitioning
(activations' `embed` over `model`) is not a default.
Switching data parallelism to FSDP or tensor parallelism is a gin change of `mesh_shape` and
`logical_axis_rules`, never a code change.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Mapping, Sequence

import flax.linen as nn
import gin
import jax
import numpy as np
import optax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t5lite.errors import ConfigError

MESH_AXES = ("data", "fsdp", "model")

# Data parallel over `data`, parameters and optimizer state sharded over `fsdp` (ZeRO-3 style),
# tensor parallel over `model`; T5X's rules for the axes it names, t5lite's own axes after them.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "model"),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv", None),
    ("joined_kv", "model"),   # heads x kv in one axis (prefix tuning's rows)
    ("embed", "fsdp"),
    ("length", None),
    ("layers", None),
    ("relpos_buckets", None),
    ("abspos_buckets", None),
    ("lora_rank", None),      # t5lite.models.peft: LoRA's rank and fused-projection axes
    ("lora_group", None),
    ("prompt_tokens", None),  # prompt tuning's virtual tokens
    ("adapter", None),        # a bottleneck adapter's units
    ("lstm_gates", "model"),  # t5lite.models.recurrent / awd_lstm: LSTM kernels [in, 4 * hidden]
    ("lstm_in", "fsdp"),
    ("lstm_hidden", None),
    ("char_vocab", None),     # ELMo's char CNN and highway layers
    ("conv_width", None),
    ("highway", "fsdp"),
)


def _resolve_mesh_shape(mesh_shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """`mesh_shape` with its -1 (if any) filled in so that it covers `num_devices`."""
    shape = list(mesh_shape)
    if len(shape) != len(MESH_AXES):
        raise ConfigError(f"mesh_shape {tuple(mesh_shape)} must have one size per mesh axis {MESH_AXES}")
    if shape.count(-1) > 1:
        raise ConfigError(f"mesh_shape {tuple(mesh_shape)}: at most one axis may be -1")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        shape[shape.index(-1)] = num_devices // known
    if int(np.prod(shape)) != num_devices:
        raise ConfigError(f"mesh_shape {tuple(mesh_shape)} -> {tuple(shape)} needs {int(np.prod(shape))} devices "
                         f"but {num_devices} are available (per slice); change Partitioner.mesh_shape")
    return tuple(shape)


@gin.configurable
class Partitioner:
    """Owns the mesh and turns logical partition specs into shardings."""

    def __init__(self, mesh_shape: Sequence[int] = (-1, 1, 1), logical_axis_rules=DEFAULT_RULES,
                 devices: Sequence[jax.Device] | None = None, num_slices: int = 1,
                 dcn_mesh_shape: Sequence[int] | None = None):
        """`mesh_shape` is the mesh within one slice (ICI); with `num_slices` > 1 the slices are
        joined over the data-centre network along `dcn_mesh_shape` (default: the `data` axis)."""
        devices = list(devices if devices is not None else jax.devices())
        if num_slices < 1 or len(devices) % num_slices:
            raise ConfigError(f"{len(devices)} devices do not split into Partitioner.num_slices={num_slices} slices")
        shape = _resolve_mesh_shape(mesh_shape, len(devices) // num_slices)
        if num_slices == 1:
            # ICI-aware order on TPU (neighbours on the torus share mesh rows); a plain reshape elsewhere.
            device_array = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
        else:
            dcn = tuple(dcn_mesh_shape or (num_slices, 1, 1))
            if len(dcn) != len(MESH_AXES) or int(np.prod(dcn)) != num_slices:
                raise ConfigError(f"Partitioner.dcn_mesh_shape {dcn} must have one size per mesh axis {MESH_AXES} "
                                 f"and multiply to num_slices={num_slices}")
            device_array = mesh_utils.create_hybrid_device_mesh(shape, dcn, devices,
                                                                allow_split_physical_axes=True)
        self.mesh = Mesh(device_array, MESH_AXES)
        self.rules = tuple((name, tuple(axes) if isinstance(axes, list) else axes)
                           for name, axes in logical_axis_rules)

    def __repr__(self):
        return f"Partitioner(mesh={dict(self.mesh.shape)}, rules={self.rules})"

    @property
    def data_parallel_size(self) -> int:
        """How many ways the batch is split (the product of the mesh axes `batch` maps to)."""
        axes = dict(self.rules).get("batch") or ()
        axes = (axes,) if isinstance(axes, str) else axes
        return int(np.prod([self.mesh.shape[a] for a in axes]))

    @property
    def process_count(self) -> int:
        """How many processes (hosts) own devices of the mesh."""
        return len(self._batch_rows_by_process)

    @contextlib.contextmanager
    def context(self):
        """The mesh and the axis rules, active while tracing so activation constraints resolve."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            yield self

    def data_shard(self, process_index: int | None = None) -> tuple[int, int]:
        """(index, count) of the data shard a process's loader reads (`t5lite.data.loader.Loader`).

        Processes whose devices hold overlapping rows of the global batch (the same indices along
        the mesh axes `batch` maps to; a `model` axis spanning hosts) read the same shard and each
        keeps the rows it holds (`shard_batch`); with one process per data-parallel replica group
        this is (group index, group count)."""
        return self._feed_plan(jax.process_index() if process_index is None else process_index)[:2]

    def _feed_plan(self, process_index: int) -> tuple[int, int, tuple[int, ...]]:
        """(shard index, shard count, which of the shard's row blocks this process holds).

        A shard is a set of processes joined by shared rows; its loader yields the rows of all
        of them in global order, one block per data-parallel row index, and this process keeps
        its own blocks (all of them unless processes hold overlapping, unequal sets of rows)."""
        shards, mine = self._row_shards, self._batch_rows_by_process[process_index]
        index = next(i for i, rows in enumerate(shards) if mine[0] in rows)
        return index, len(shards), tuple(shards[index].index(row) for row in mine)

    @functools.cached_property
    def _row_shards(self) -> list[tuple[int, ...]]:
        """The batch's data-parallel row indices, grouped into the shards that loaders read: the
        connected sets of processes sharing a row, each as its sorted rows, ordered by first row."""
        shards: list[set[int]] = []
        for rows in self._batch_rows_by_process.values():
            joined = set(rows).union(*(s for s in shards if s & set(rows)))
            shards = [s for s in shards if not s & set(rows)] + [joined]
        shards = sorted((tuple(sorted(s)) for s in shards), key=lambda s: s[0])
        if len({len(s) for s in shards}) > 1:
            raise ConfigError(
                f"mesh {dict(self.mesh.shape)}: the hosts hold unequal parts of the batch "
                f"({ {p: list(r) for p, r in sorted(self._batch_rows_by_process.items())} }), so their data shards "
                "would differ in size; change Partitioner.mesh_shape so the data axes split evenly over the hosts")
        return shards

    @functools.cached_property
    def _batch_rows_by_process(self) -> dict[int, tuple[int, ...]]:
        """For each process, the (sorted) indices along the batch's mesh axes its devices hold."""
        axes = dict(self.rules).get("batch") or ()
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        names = list(self.mesh.axis_names)
        sizes = [self.mesh.shape[a] for a in axes]
        rows: dict[int, set[int]] = {}
        for coords, device in np.ndenumerate(self.mesh.devices):
            row = int(np.ravel_multi_index([coords[names.index(a)] for a in axes], sizes)) if axes else 0
            rows.setdefault(device.process_index, set()).add(row)
        return {p: tuple(sorted(r)) for p, r in rows.items()}

    def sharding(self, logical_spec: P | None) -> NamedSharding:
        spec = nn.logical_to_mesh_axes(tuple(logical_spec or ()), self.rules)
        return NamedSharding(self.mesh, spec)

    def param_shardings(self, abstract_variables) -> Any:
        """Shardings for a tree of (possibly `nn.Partitioned`-boxed) abstract variables."""
        specs = nn.get_partition_spec(abstract_variables)
        return jax.tree.map(self.sharding, specs, is_leaf=lambda x: isinstance(x, P))

    def opt_state_shardings(self, optimizer: optax.GradientTransformation, abstract_opt_state, abstract_params,
                            param_specs) -> Any:
        """Shards each optimizer-state leaf like its parameter.

        Leaves of the parameter's rank keep its spec on every dimension they have at full size and
        replicate the reduced (size-1) ones: Adam's moments are sharded like the parameter,
        Adafactor's row/column statistics (t5lite.train.adafactor) like the dimensions they keep.
        Anything else (counts, scalar placeholders) is replicated.
        """
        pairs = jax.tree.map(lambda p, s: (p.shape, s), abstract_params, param_specs,
                             is_leaf=lambda x: isinstance(x, P))

        def spec_for(leaf, shape_and_spec):
            shape, spec = shape_and_spec
            if len(leaf.shape) != len(shape):
                return self.sharding(P())
            spec = tuple(spec) + (None,) * (len(shape) - len(spec))
            return self.sharding(P(*(s if n == m else None for s, n, m in zip(spec, leaf.shape, shape))))

        return optax.tree_map_params(optimizer, spec_for, abstract_opt_state, pairs,
                                     transform_non_params=lambda _: self.sharding(P()),
                                     is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], P))

    def batch_sharding(self, ndim: int = 2) -> NamedSharding:
        return self.sharding(P("batch", *([None] * (ndim - 1))))

    def shard_batch(self, local_batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """The global batch from this process's data shard (multi-host safe).

        `local_batch` holds the shard's rows in global order (`data_shard`); this process keeps the
        blocks its devices hold, which `jax.make_array_from_process_local_data` places wherever
        the mesh puts them (a device order that interleaves hosts included)."""
        _, shard_count, mine = self._feed_plan(jax.process_index())
        blocks = self.data_parallel_size // shard_count   # row blocks per shard
        out = {}
        for name, value in local_batch.items():
            global_shape = (value.shape[0] * shard_count,) + value.shape[1:]
            if len(mine) < blocks:
                value = value.reshape((blocks, -1) + value.shape[1:])[list(mine)].reshape((-1,) + value.shape[1:])
            out[name] = jax.make_array_from_process_local_data(self.batch_sharding(value.ndim), value, global_shape)
        return out

    def check_batch_size(self, global_batch_size: int, num_microbatches: int = 1) -> None:
        """Refuses a batch that does not split evenly into microbatches, data-parallel rows and host shards."""
        per_step = global_batch_size // max(num_microbatches, 1)
        shards = self.data_shard()[1]
        if global_batch_size < 1 or global_batch_size % max(num_microbatches, 1) or per_step % self.data_parallel_size:
            raise ConfigError(
                f"BATCH_SIZE={global_batch_size} with {num_microbatches} microbatch(es) must split evenly over "
                f"the {self.data_parallel_size}-way data-parallel mesh {dict(self.mesh.shape)} ({shards} host data "
                f"shard(s)); choose a multiple of {self.data_parallel_size * max(num_microbatches, 1)}")
