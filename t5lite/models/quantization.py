"""Int8 weight-only quantisation: the numerics shared by the quantised layers, `t5lite convert
--quantize int8` and checkpoint loading.

Per output channel, symmetric absmax: scale = absmax / 127.5, q = clip(round(w / scale), -128,
127), w ~ q * scale (Qwix's `core/qarray.py`; torchao's `Int8WeightOnlyConfig` uses the same
rule). Quantising and dequantising go through Qwix's array API, so t5lite's int8 weights are
exactly Qwix's. A quantised layer keeps `kernel` as int8 and a float32 `kernel_scale` shaped like
the kernel with its input axes reduced to 1 (an embedding table: one scale per row), and
computes `(x @ q) * scale`, the weight-only matmul of torchao.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite.errors import ConfigError

WEIGHT_QUANTIZATIONS = ("none", "int8")
SCALE_SUFFIX = "_scale"


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


def quantize_params(params, abstract_quantized) -> dict:
    """Float `params` in the layout of a quantised model (`abstract_quantized`, its params'
    shapes): each weight the model holds as int8 quantised with its `<name>_scale`, every other
    leaf of `params` as it is."""
    floats, wanted = flatten_dict(params), flatten_dict(abstract_quantized)
    int8, out = quantized_leaves(abstract_quantized), {}
    for path, leaf in floats.items():   # the model may own more (a pre-training head a task run dropped)
        if path in int8:
            out[path], out[_scale_path(path)] = quantize(leaf, wanted[_scale_path(path)].shape)
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
