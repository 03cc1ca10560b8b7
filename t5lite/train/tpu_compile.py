"""Compile the train step for a TPU slice from any machine: does the plan fit, what does it cost?

`t5lite compile` builds what `t5lite train` would build on the slice — the mesh (over the
compile-only devices of `jax.experimental.topologies`), logical-axis shardings, abstract state and
the jitted step — lowers it with `ShapeDtypeStruct`s (no data, no TPU, no parameters in memory)
and lets the TPU compiler (libtpu) report per-device memory, FLOPs and the collectives it inserted.

Before XLA sees it, the plan is checked: the slice's name, the batch against the mesh and the
hosts' data shards, and a lower bound of the memory per device against the chip's HBM (XLA
takes minutes over a plan far too large, or aborts on sizes that overflow its arithmetic).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import time
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5lite import models
from t5lite.data.converter_registry import get_feature_converter
from t5lite.errors import ConfigError
from t5lite.infer import decoding, predict
from t5lite.models import flops
from t5lite.models.config import ModelConfig
from t5lite.train.partitioning import Partitioner
from t5lite.train.step import TrainTask

log = logging.getLogger("t5lite")
GIB = 1024 ** 3
# HBM per chip, by the generation prefix of a topology name ("v5e:4x4", "v4:2x2x1").
HBM_BYTES = {"v4": 32 * GIB, "v5e": 16 * GIB, "v5p": 95 * GIB, "v6e": 32 * GIB}
MEGACORE = ("v4", "v5p")   # two TensorCores per chip, 3-D shapes; the others count chips in 2-D shapes
GENERATION_ALIASES = {"v5litepod": "v5e"}   # Cloud TPU's name of v5e, unknown to libtpu
TOPOLOGY_FORM = ("a shape such as v5e:4x4, v6e:2x4, v4:2x2x4, v5p:2x4x4 or an accelerator type such as v4-32, "
                 "v5p-64, v5litepod-16")
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_COLLECTIVE_RE = re.compile(r"=\s*(\(.*?\)|\S+)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(")
_ARRAY_RE = re.compile(r"\b(pred|bf16|[fsuc]\d+|f8e\w+)\[([\d,]*)\]")
_ITEMSIZE = {"pred": 1, "bf16": 2, "f16": 2, "f32": 4, "f64": 8, "s8": 1, "s16": 2, "s32": 4, "s64": 8, "u8": 1,
             "u16": 2, "u32": 4, "u64": 8, "c64": 8, "c128": 16}
# The TPU compiler's refusals: "...HLO temporaries (16.16G) exceeds available HBM (15.75G)" and
# "Used 20.5G of 15.75G hbm".
_OOM_RES = (re.compile(r"temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)"),
            re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm"))


def topology_name(topology: str) -> str:
    """libtpu's name of a slice: a shape ("v5e:4x4") checked, or a Cloud TPU accelerator type ("v4-32",
    "v5p-64", "v5litepod-16", "v6e-16") as the shape Cloud TPU gives it. libtpu dies of SIGFPE on a
    zero side, so every shape is checked here before it reaches libtpu."""
    text = topology.strip().lower()
    accelerator = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", text)
    if accelerator:
        return _accelerator_shape(topology, _generation(topology, accelerator.group(1)), int(accelerator.group(2)))
    shape = re.fullmatch(r"(v\d+[a-z]*):([^:]*)", text)
    if not shape:
        raise ConfigError(f"--topology={topology}: give {TOPOLOGY_FORM}")
    generation, sides = _generation(topology, shape.group(1)), shape.group(2).split("x")
    dimensions = 3 if generation in MEGACORE else 2
    if len(sides) != dimensions or not all(re.fullmatch(r"0*[1-9]\d*", side) for side in sides):
        form = "x".join("ABC"[:dimensions])
        raise ConfigError(f"--topology={topology}: a {generation} shape is {generation}:{form} with whole numbers "
                          f"of at least 1; give {TOPOLOGY_FORM}")
    return f"{generation}:{'x'.join(str(int(side)) for side in sides)}"


def _generation(topology: str, name: str) -> str:
    """The TPU generation a topology names, refused unless t5lite knows its chip (HBM, shape)."""
    generation = GENERATION_ALIASES.get(name, name)
    if generation not in HBM_BYTES:
        raise ConfigError(f"--topology={topology}: unknown TPU generation {name!r}; known: "
                          f"{sorted(HBM_BYTES) + sorted(GENERATION_ALIASES)}")
    return generation


def _accelerator_shape(topology: str, generation: str, count: int) -> str:
    """The shape Cloud TPU gives an accelerator type of `count` cores (v4, v5p: two per chip, 3-D)
    or chips (v5e, v6e: 2-D)."""
    three_d = generation in MEGACORE
    chips, dims = (count // 2, [2, 2, 1]) if three_d else (count, [1, 1])
    while math.prod(dims) < chips:  # double the smallest side, the last one first: 2x2x1, 2x2x2, 2x2x4, 2x4x4
        smallest = max(i for i, d in enumerate(dims) if d == min(dims))
        dims[smallest] *= 2
    if math.prod(dims) != chips or (three_d and count % 2):
        raise ConfigError(f"--topology={topology}: no Cloud TPU slice has that size; give {TOPOLOGY_FORM}")
    return f"{generation}:{'x'.join(map(str, dims))}"


def topology_devices(topology: str, num_slices: int = 1) -> list:
    """The compile-only TPU devices of `topology` ("v5e:4x4", "v4-32"), `num_slices` copies over DCN."""
    import importlib.util
    name = topology_name(topology)
    if importlib.util.find_spec("libtpu") is None:
        raise ConfigError(f"--topology={topology}: compiling for a TPU needs libtpu; install the `tpu` extra "
                          "(pip install 't5lite[tpu]')")
    from jax.experimental import topologies
    # Compile-only: no chip is opened, so several processes (parallel tests, compiles) may load libtpu.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        # One JAX device per chip, as on a real v4 / v5p VM (its two TensorCores as one "megacore").
        chip = {"chip_config_name": "megacore"} if name.split(":")[0].lower() in MEGACORE else {}
        desc = topologies.get_topology_desc(name, "tpu", num_slices=num_slices, **chip)
    except Exception as e:  # a name this libtpu does not know
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError(f"--topology={topology}: libtpu cannot describe {name!r} ({reason}); use a shape it "
                          "knows such as v5e:4x4, v4:2x2x4, v5p:2x4x4, or an accelerator type such as v4-32, or "
                          "upgrade libtpu (pip install -U 't5lite[tpu]')") from None
    return list(desc.devices)


def hbm_bytes(topology: str) -> int:
    return HBM_BYTES[topology_name(topology).split(":")[0]]


def train_activation_bytes(config: ModelConfig, lengths: Mapping[str, int], rows: int, model_parallel: int) -> int:
    """A lower bound of the activations one device keeps for a microbatch of `rows` rows: each
    layer's input, saved for the backward pass under any remat policy, and the LM head's float32
    logits (vocabulary split over the `model` axis)."""
    enc, dec = lengths.get("encoder_input_tokens", 0), lengths.get("decoder_input_tokens", 0)
    itemsize = np.dtype(jnp.dtype(config.dtype)).itemsize
    layers = enc * config.num_encoder_layers + dec * config.num_decoder_layers
    return rows * (layers * config.d_model * itemsize + (dec or enc) * -(-config.vocab_size // model_parallel) * 4)


def decode_activation_bytes(config: ModelConfig, rows: int, input_length: int, max_decode_length: int,
                            model_parallel: int) -> int:
    """A lower bound of what decoding `rows` rows (beams counted) keeps on one device: the self-
    attention key/value cache (heads split over `model`), the encoder's output, one step's logits."""
    itemsize = np.dtype(jnp.dtype(config.dtype)).itemsize
    decoder_only = config.arch == "decoder"
    cache_length = input_length + max_decode_length if decoder_only else max_decode_length
    heads = -(-config.num_heads // model_parallel)
    cache = config.num_decoder_layers * 2 * cache_length * heads * config.head_dim * itemsize
    encoder = 0 if decoder_only else input_length * config.d_model * itemsize
    return rows * (cache + encoder + -(-config.vocab_size // model_parallel) * 4)


def check_memory(what: str, sizes: Mapping[str, int], activations: int, hbm: int, knobs: str) -> None:
    """Refuses a plan whose lower bound of memory per device already exceeds the chip's HBM."""
    total = sum(sizes.values()) + activations
    if total > hbm:
        g = lambda b: f"{b / GIB:,.2f} GiB"  # noqa: E731
        raise ConfigError(f"{what} needs at least {g(total)} per device (params {g(sizes['params_bytes'])}, optimizer "
                          f"state {g(sizes['opt_state_bytes'])}, batch {g(sizes['batch_bytes'])}, activations "
                          f"{g(activations)}), more than the chip's {g(hbm)} of HBM; try {knobs}")


def per_device_bytes(abstract_tree) -> int:
    """Bytes one device holds of a tree of sharded ShapeDtypeStructs (the largest shard)."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(abstract_tree))


def collectives(hlo_text: str) -> dict[str, tuple[int, int]]:
    """{op: (count, bytes)} of the collectives in compiled HLO text. Bytes are each op's result
    (for an async `-start`, its largest buffer: the gathered / reduced array)."""
    found = {op: [0, 0] for op in COLLECTIVES}
    for match in _COLLECTIVE_RE.finditer(hlo_text):
        result_type, op, is_async = match.groups()
        sizes = [math.prod(int(d) for d in dims.split(",") if d) * _itemsize(dtype)
                 for dtype, dims in _ARRAY_RE.findall(result_type)]
        found[op][0] += 1
        found[op][1] += (max(sizes) if is_async else sum(sizes)) if sizes else 0
    return {op: tuple(v) for op, v in found.items()}


def _itemsize(hlo_dtype: str) -> int:
    return 1 if hlo_dtype.startswith("f8") else _ITEMSIZE.get(hlo_dtype, 4)


@dataclasses.dataclass
class CompileReport:
    mesh: dict
    num_devices: int
    hbm_bytes: int
    params_bytes: int            # per device
    opt_state_bytes: int         # per device
    batch_bytes: int             # per device
    temp_bytes: int | None       # activations and other temporaries, per device (None: refused)
    total_bytes: int             # per device
    compiler_limit_bytes: int | None  # the HBM the compiler said it could use, when it refused
    compiler_message: str | None  # the compiler's refusal, verbatim
    fits: bool
    compiled_flops: float | None  # whole step, all devices
    model_flops: float
    collectives: dict | None     # None: the compiler could not print the compiled program
    compile_seconds: float
    scanned: bool                # XLA's cost analysis counts a loop body once: compiled FLOPs undercount
    knobs: str
    decode_loop: bool = False    # infer: XLA counts the decode loop's body once too
    batch: str = ""              # how the batch splits over devices and hosts

    def format(self) -> str:
        g = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
        lines = [f"mesh {self.mesh} ({self.num_devices} devices), HBM {g(self.hbm_bytes)} per device",
                 *([self.batch] if self.batch else []),
                 f"per device: params {g(self.params_bytes)}, optimizer state {g(self.opt_state_bytes)}, "
                 f"batch {g(self.batch_bytes)}, activations/temp "
                 f"{g(self.temp_bytes) if self.temp_bytes is not None else '?'}, total {g(self.total_bytes)}"]
        if self.compiler_message is not None:
            lines.append(f"the TPU compiler refused: {self.compiler_message}")
            if self.compiler_limit_bytes is not None:
                lines.append(f"  (its HBM limit: {g(self.compiler_limit_bytes)} per device)")
        lines.append(f"fits: {'yes' if self.fits else 'NO'}")
        if self.compiled_flops is not None:
            lines.append(f"FLOPs/step: compiled {self.compiled_flops:.4g}, model {self.model_flops:.4g} "
                         f"(ratio {self.compiled_flops / self.model_flops:.2f}; the excess is rematerialisation "
                         "and non-matmul work)")
            if self.decode_loop:
                lines.append("  (decoding: XLA counts the decode loop's body once, so the compiled FLOPs cover the "
                             "prefill and one step; the model FLOPs cover every position)")
            if self.scanned:
                lines.append("  (scanned layers: XLA counts the loop body once, so the compiled FLOPs are a lower "
                             "bound; compile with --gin.model_config.scan_layers=False to compare)")
        if self.compiler_message is None:
            if self.collectives is None:
                lines.append("collectives per step: unknown (the TPU compiler could not print the compiled program)")
            else:
                moved = ", ".join(f"{op} {n} ({b / 2**20:.1f} MiB)" for op, (n, b) in self.collectives.items() if n)
                lines.append(f"collectives per step: {moved or 'none'}")
        lines.append(f"compile time: {self.compile_seconds:.1f} s")
        if not self.fits:
            lines.append(f"to fit, try: {self.knobs}")
        return "\n".join(lines)


def _knobs(config: ModelConfig, partitioner: Partitioner, batch_size: int, num_microbatches: int) -> str:
    return (f"more FSDP via Partitioner.mesh_shape (now {dict(partitioner.mesh.shape)}; (1, -1, 1) shards "
            f"everything), model_config.remat_policy='full' (now {config.remat_policy!r}), "
            f"train.num_microbatches (now {num_microbatches}), a smaller BATCH_SIZE (now {batch_size}), "
            "or a larger slice")


def compile_train_step(model_config: ModelConfig, optimizer: optax.GradientTransformation, schedule,
                       partitioner: Partitioner, task_feature_lengths: Mapping[str, int], batch_size: int,
                       hbm: int, feature_converter: str = "enc_dec", pack: bool = True,
                       num_microbatches: int = 1) -> CompileReport:
    """Lowers and compiles `TrainTask.jit_train_step()` for `partitioner`'s mesh from shapes only."""
    partitioner.check_batch_size(batch_size, num_microbatches)
    lengths = get_feature_converter(feature_converter).model_feature_lengths(task_feature_lengths, pack=pack)
    task = TrainTask(model_config, optimizer, schedule, partitioner, lengths, num_microbatches=num_microbatches)
    batch = {k: jax.ShapeDtypeStruct((batch_size, n), jnp.int32, sharding=partitioner.batch_sharding())
             for k, n in lengths.items()}
    state = task.abstract_state
    sizes = dict(params_bytes=per_device_bytes(state.params), opt_state_bytes=per_device_bytes(state.opt_state),
                 batch_bytes=per_device_bytes(batch))
    knobs = _knobs(model_config, partitioner, batch_size, num_microbatches)
    rows = batch_size // (partitioner.data_parallel_size * num_microbatches)
    check_memory(f"BATCH_SIZE={batch_size} ({rows} rows per device and microbatch)", sizes,
                 train_activation_bytes(model_config, lengths, rows, partitioner.mesh.shape["model"]), hbm, knobs)
    shards = partitioner.data_shard()[1]
    common = dict(mesh=dict(partitioner.mesh.shape), num_devices=partitioner.mesh.size, hbm_bytes=hbm,
                  model_flops=task.flops_per_step(batch_size), scanned=model_config.scan_layers, knobs=knobs,
                  batch=f"batch {batch_size}: {rows} rows per device and microbatch; {partitioner.process_count} "
                        f"host(s) read {shards} data shard(s) of {batch_size // shards} rows")
    with task.mesh_context():
        return _compile(lambda: task.jit_train_step().lower(state, batch), partitioner, sizes, common)


def _compile(lower, partitioner: Partitioner, sizes: Mapping[str, int], common: Mapping) -> CompileReport:
    """Lowers and compiles, and reads memory, FLOPs and collectives from the TPU compiler (or its refusal)."""
    log.info("the TPU compiler is compiling for mesh %s over %d devices on %d host(s); a large model takes minutes",
             common["mesh"], common["num_devices"], partitioner.process_count)
    start = time.perf_counter()
    lowered = lower()
    try:
        compiled = lowered.compile()
    except Exception as e:  # the TPU compiler's CompileTimeHbmOom is a RESOURCE_EXHAUSTED runtime error
        message = str(e)
        if "RESOURCE_EXHAUSTED" not in message and "HbmOom" not in message:
            raise
        oom = next((m for m in (r.search(message) for r in _OOM_RES) if m), None)
        needed, limit = ((_bytes(*oom.group(1, 2)), _bytes(*oom.group(3, 4))) if oom else (None, None))
        temporaries = needed if oom and oom.re is _OOM_RES[0] else None
        total = (needed if temporaries is None else needed + sum(sizes.values())) if oom else sum(sizes.values())
        return CompileReport(temp_bytes=temporaries, total_bytes=total or 0, compiler_limit_bytes=limit,
                             compiler_message=message.splitlines()[0], fits=False, compiled_flops=None,
                             collectives={}, compile_seconds=time.perf_counter() - start, **sizes, **common)
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    total = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
             + memory.temp_size_in_bytes + memory.generated_code_size_in_bytes)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    try:
        moved = collectives(compiled.as_text())
    except jax.errors.JaxRuntimeError:  # libtpu fails to print some programs it compiled (v5p-64's train step)
        moved = None
    return CompileReport(temp_bytes=memory.temp_size_in_bytes, total_bytes=total, compiler_limit_bytes=None,
                         compiler_message=None, fits=total <= common["hbm_bytes"],
                         compiled_flops=cost["flops"] * partitioner.mesh.size,
                         collectives=moved, compile_seconds=seconds, **sizes, **common)


def _decode_knobs(config: ModelConfig, partitioner: Partitioner, batch_size: int, max_decode_length: int) -> str:
    knobs = []
    if partitioner.mesh.shape["model"] < partitioner.mesh.size:
        knobs.append(f"tensor parallelism via Partitioner.mesh_shape (now {dict(partitioner.mesh.shape)}; "
                     "(1, 1, -1) shards heads and mlp over every device)")
    knobs.append(f"a smaller infer.batch_size (now {batch_size}) or infer.max_decode_length (now {max_decode_length})")
    if config.dtype != "bfloat16":
        knobs.append("model_config.dtype='bfloat16'")
    return ", ".join(knobs + ["or a larger slice"])


def compile_decode(model_config: ModelConfig, partitioner: Partitioner, batch_size: int, input_length: int,
                   max_decode_length: int, hbm: int, method: str = "greedy", num_beams: int = 4) -> CompileReport:
    """Lowers and compiles what `t5lite infer` runs for one batch (prefill + the decode loop, KV cache
    included) with the parameters sharded by their logical axes and the batch over `data`.

    The report's "optimizer state" is 0; temporaries hold the cache. `model_flops` is the forward
    pass over every input and decoded position (t5lite.models.flops), times `num_beams` for beam search.
    The batch is filled up to a multiple of the data-parallel size, as `Predictor` fills it."""
    if method not in ("greedy", "beam"):
        raise ConfigError(f"infer.method={method!r}: compile supports 'greedy' and 'beam'")
    if model_config.arch == "encoder":
        raise ConfigError("this model is encoder-only (arch 'encoder'): it has no decode step to compile")
    if batch_size < 1:
        raise ConfigError(f"infer.batch_size={batch_size}: use a positive batch size")
    rows, given = partitioner.data_parallel_size, batch_size
    batch_size = -(-batch_size // rows) * rows
    module, decoder_only = models.build(model_config), model_config.arch == "decoder"
    params = predict.abstract_params(model_config, partitioner)
    batch_sharding = partitioner.batch_sharding()
    if decoder_only:
        inputs = {"decoder_prompt_tokens": jax.ShapeDtypeStruct((batch_size, input_length), jnp.int32,
                                                                 sharding=batch_sharding),
                  "decoder_prompt_lengths": jax.ShapeDtypeStruct((batch_size,), jnp.int32,
                                                                  sharding=partitioner.batch_sharding(1))}
    else:
        inputs = {"encoder_input_tokens": jax.ShapeDtypeStruct((batch_size, input_length), jnp.int32,
                                                               sharding=batch_sharding)}

    def run(params, inputs):
        if method == "beam":
            return decoding.beam_search(module, params, inputs, max_decode_length=max_decode_length,
                                        num_beams=num_beams).tokens
        return decoding.greedy(module, params, inputs, max_decode_length=max_decode_length).tokens

    sizes = dict(params_bytes=per_device_bytes(params), opt_state_bytes=0, batch_bytes=per_device_bytes(inputs))
    copies = num_beams if method == "beam" else 1
    knobs = _decode_knobs(model_config, partitioner, given, max_decode_length)
    activations = decode_activation_bytes(model_config, batch_size // rows * copies, input_length, max_decode_length,
                                          partitioner.mesh.shape["model"])
    check_memory(f"infer.batch_size={given} with max_input_length={input_length}, "
                 f"max_decode_length={max_decode_length}", sizes, activations, hbm, knobs)
    encoder_length, decoder_length = ((0, input_length + max_decode_length) if decoder_only
                                      else (input_length, max_decode_length))
    model_flops = batch_size * copies * flops.forward_flops_per_example(model_config, encoder_length, decoder_length)
    common = dict(mesh=dict(partitioner.mesh.shape), num_devices=partitioner.mesh.size, hbm_bytes=hbm,
                  model_flops=model_flops, scanned=model_config.scan_layers, decode_loop=True, knobs=knobs,
                  batch=f"batch {batch_size}" + (f" (infer.batch_size={given} filled up to a multiple of the "
                                                 f"{rows} data-parallel rows)" if given != batch_size else ""))
    with partitioner.context():
        jitted = jax.jit(run, in_shardings=jax.tree.map(lambda x: x.sharding, (params, inputs)))
        return _compile(lambda: jitted.lower(params, inputs), partitioner, sizes, common)


def _bytes(value: str, unit: str) -> int:
    return int(float(value) * 1024 ** " KMGT".index(unit or " "))


def compile_from_gin(topology: str, num_slices: int = 1) -> CompileReport:
    """`compile_train_step` with the arguments the parsed gin config gives `train`."""
    import gin
    gin.bind_parameter("train.partitioner", None)  # not built on this host's devices: see below
    bound = gin.get_bindings("train")
    optimizer, schedule = bound["optimizer"]
    hbm = hbm_bytes(topology)
    # The gin-configured Partitioner (mesh_shape, rules), over the slice's devices instead of this host's.
    partitioner = Partitioner(devices=topology_devices(topology, num_slices), num_slices=num_slices)
    return compile_train_step(bound["model"], optimizer, schedule, partitioner, bound["task_feature_lengths"],
                              bound["batch_size"], hbm,
                              feature_converter=bound.get("feature_converter", "enc_dec"),
                              pack=bound.get("pack", True), num_microbatches=bound.get("num_microbatches", 1))


def compile_decode_from_gin(topology: str, num_slices: int = 1) -> CompileReport:
    """`compile_decode` with the arguments the parsed gin config gives `infer` (gin/infer.gin)."""
    import gin
    bound = gin.get_bindings("infer")
    defaults = dict(batch_size=16, max_input_length=512, max_decode_length=64, method="greedy", num_beams=4)
    options = {k: bound.get(k, v) for k, v in defaults.items()}
    hbm = hbm_bytes(topology)
    partitioner = Partitioner(devices=topology_devices(topology, num_slices), num_slices=num_slices)
    return compile_decode(bound["model"], partitioner, options["batch_size"], options["max_input_length"],
                          options["max_decode_length"], hbm, options["method"], options["num_beams"])
