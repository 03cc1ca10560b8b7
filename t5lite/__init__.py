"""t5lite: pre-train and fine-tune Transformers in JAX/Flax, the T5X way, small enough to read."""
__version__ = "0.1.0"
