"""Int8 weight-only quantisation: the numerics shared by the quantised layers, `t5lite convert
--quantize int8` and checkpoint loading.

Per output channel, symmetric absmax: scale = absmax / 127.5, q = clip(round(w / scale), -128,
127), w ~ q * scale (Qwix's `core/qarray.py`; torchao's `Int8WeightOnlyConfig` uses the same
rule). Quantising and dequantising go through Qwix's array API, so t5lite's int8 weights are
exactly Qwix's. A quantised layer keeps `kernel` as int8 and a float32 `kernel_scale` shaped like
the kernel with its input axes reduced to 1 (an embedding table: one scale per row), and
computes `(x @ q) * scale`, the weight-only matmul of torchao.

Int4 (`t5lite convert --quantize int4`) is a storage format, torchao's `Int4WeightOnlyConfig`
(0.18: version 2, plain packing, `Int4Tensor.from_hp`, which quantises with MSLK's
`int4_row_quantize_zp` and packs with its `pack_int4`): each dense kernel, flattened to [inputs,
outputs], gets per output channel and group of `INT4_GROUP` inputs an asymmetric scale and zero
point, scale = max(max - min, 1e-6) / 15, zero = min + 8 scale, q = clip(round((w - min) / scale),
0, 15) - 8 in [-8, 7], w ~ q * scale + zero; two values per byte (`uint8`, the even input row in
the low nibble), float32 `kernel_scale` and `kernel_zero` [groups, outputs] beside it. A kernel
whose inputs the group does not divide stays float32, as torchao skips it. Embedding tables are
int8 as above. Loading dequantises it to a float32 model: XLA:CPU has no int4 matmul.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite.errors import ConfigError

WEIGHT_QUANTIZATIONS = ("none", "int8", "int4")
SCALE_SUFFIX = "_scale"
ZERO_SUFFIX = "_zero"
INT4_GROUP = 128   # inputs per int4 scale and zero point: Int4WeightOnlyConfig's default group_size


def _qwix():
    try:
        import qwix
    except ImportError:
        raise ConfigError("int8 quantisation needs Qwix: pip install 't5lite[quant]'") from None
    return qwix


def channel_axes(scale_shape) -> tuple[int, ...]:
    """The axes with one scale per entry: those a stored scale keeps at full size."""
    return tuple(i for i, n in enumerate(scale_shape) if n != 1)


def quantize(weight, scale_shape) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(int8 values, float32 scale of `scale_shape`) of a float weight, per the channels that
    `scale_shape` keeps."""
    qarray = _qwix().quantize(jnp.asarray(weight, jnp.float32), jnp.int8,
                              channelwise_axes=channel_axes(scale_shape), calibration_method="absmax")
    return qarray.qvalue, qarray.scale.reshape(scale_shape)


def dequantize(qvalue, scale) -> jnp.ndarray:
    """The float32 weight an int8 weight stands for (q * scale)."""
    qwix = _qwix()
    return qwix.dequantize(qwix.QArray(qvalue, jnp.asarray(scale, jnp.float32), None, jnp.int8))


def _is_int8(leaf) -> bool:
    return jnp.dtype(leaf.dtype) == jnp.int8


def _scale_path(path: tuple[str, ...]) -> tuple[str, ...]:
    return path[:-1] + (path[-1] + SCALE_SUFFIX,)


def quantized_leaves(tree) -> set[tuple[str, ...]]:
    """Paths of the int8 weights of a (stored or abstract) params tree that have a scale beside them."""
    flat = flatten_dict(tree)
    return {p for p, leaf in flat.items() if _is_int8(leaf) and _scale_path(p) in flat}


def quantize_int4(weight, in_ndim: int) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """(packed uint8 [inputs / 2, outputs], float32 scales and zero points [groups, outputs]) of a
    float kernel whose first `in_ndim` axes are its inputs, `INT4_GROUP` of which divide them."""
    w = np.asarray(weight, np.float32)
    inputs = int(np.prod(w.shape[:in_ndim]))
    groups = w.reshape(inputs // INT4_GROUP, INT4_GROUP, -1)
    low, high = groups.min(axis=1), groups.max(axis=1)
    scale = np.maximum(high - low, np.float32(1e-6)) / np.float32(15)
    zero = low + scale * np.float32(8)
    q = np.clip(np.round((groups - low[:, None]) / scale[:, None]), 0, 15).astype(np.int8).reshape(inputs, -1) - 8
    packed = (q[0::2] & 0xF) | ((q[1::2] & 0xF) << 4)
    return jnp.asarray(packed.astype(np.uint8)), jnp.asarray(scale), jnp.asarray(zero)


def dequantize_int4(packed, scale, zero, shape) -> jnp.ndarray:
    """The float32 kernel of `shape` (inputs first) that a packed int4 kernel and its group
    scales and zero points [groups, outputs] stand for: q * scale + zero."""
    packed = np.asarray(packed, np.uint8)
    nibbles = np.stack([packed & 0xF, packed >> 4], axis=1).reshape(-1, packed.shape[1]).astype(np.int8)
    q = np.where(nibbles >= 8, nibbles - 16, nibbles).astype(np.float32)
    repeat = q.shape[0] // np.shape(scale)[0]
    w = q * np.repeat(np.asarray(scale, np.float32), repeat, axis=0) + np.repeat(np.asarray(zero, np.float32),
                                                                                 repeat, axis=0)
    return jnp.asarray(w.reshape(shape))


def zero_path(path: tuple[str, ...]) -> tuple[str, ...]:
    return path[:-1] + (path[-1] + ZERO_SUFFIX,)


def int4_leaves(tree) -> set[tuple[str, ...]]:
    """Paths of the packed int4 kernels of a stored params tree (uint8 with a scale beside them)."""
    flat = flatten_dict(tree)
    return {p for p, leaf in flat.items() if jnp.dtype(leaf.dtype) == jnp.uint8 and _scale_path(p) in flat}


def quantize_params(params, abstract_quantized, scheme: str = "int8") -> dict:
    """Float `params` in the layout of a quantised model (`abstract_quantized`, its params'
    shapes): each weight the model holds as int8 quantised with its `<name>_scale` (`scheme`
    'int4': its dense kernels packed int4 with group scales and zero points instead, or float
    where the group does not divide their inputs), every other leaf of `params` as it is."""
    floats, wanted = flatten_dict(params), flatten_dict(abstract_quantized)
    int8, out = quantized_leaves(abstract_quantized), {}
    for path, leaf in floats.items():   # the model may own more (a pre-training head a task run dropped)
        scale_shape = wanted[_scale_path(path)].shape if path in int8 else None
        if path in int8 and scheme == "int4" and path[-1] == "kernel":
            # the leading reduced axes (all of them but the last when every axis is reduced: one output)
            in_ndim = next((i for i, n in enumerate(scale_shape) if n != 1), len(scale_shape) - 1)
            if int(np.prod(np.shape(leaf)[:in_ndim])) % INT4_GROUP:
                out[path] = leaf
            else:
                out[path], out[_scale_path(path)], out[zero_path(path)] = quantize_int4(leaf, in_ndim)
        elif path in int8:
            out[path], out[_scale_path(path)] = quantize(leaf, scale_shape)
        else:
            out[path] = leaf
    return unflatten_dict(out)


def dequantize_params(params, paths) -> dict:
    """`params` with each int8 weight at `paths` replaced by its float32 value (scale dropped)."""
    flat = flatten_dict(params)
    for path in paths:
        flat[path] = dequantize(flat[path], flat.pop(_scale_path(path)))
    return unflatten_dict(flat)


# Quantised training: the bound of Qwix's symmetric integer types is qmax + 0.5 (int4: 7.5).
TRAINING_QTYPES = {"int8": jnp.int8, "int4": jnp.int4}
# Attention's own einsums multiply activations (queries, keys, probabilities, values), and
# Shaw's has three operands, which Qwix's einsum does not take: that module is left alone.
_ACTIVATION_MATMULS = r"(.*/)?\w*attention"


def quantized_training_model(module, qtype: str):
    """`module` whose `__call__` runs every weight matmul (dense kernels, tied logits) on weights
    quantised per output channel to `qtype` ('int8' or 'int4') in the forward pass, with
    straight-through gradients to the float weights (Qwix's quantized training, `QtProvider`);
    the params stay the float model's."""
    if qtype not in TRAINING_QTYPES:
        raise ConfigError(f"train.quantization={qtype!r}: expected one of {sorted(TRAINING_QTYPES)} or None")
    qwix = _qwix()
    rules = [qwix.QtRule(module_path=_ACTIVATION_MATMULS),
             qwix.QtRule(module_path=".*", weight_qtype=TRAINING_QTYPES[qtype])]
    return qwix.quantize_model(module, qwix.QtProvider(rules))
