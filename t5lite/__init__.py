"""t5lite: pre-train and fine-tune Transformers in JAX/Flax, the T5X way, small enough to read."""
from t5lite import xla_flags as _xla_flags

_xla_flags.apply_cpu_defaults()   # before anything creates JAX's CPU backend

__version__ = "0.1.0"
