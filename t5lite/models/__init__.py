"""Models: configs and presets, and `build(config)` -> a Flax module."""
from t5lite.models.config import PRESETS, ModelConfig, get_config
from t5lite.models.transformer import EncoderDecoder


def build(config: ModelConfig | str):
    """A Flax module for a config (or a preset name)."""
    if isinstance(config, str):
        config = get_config(config)
    if config.arch == "encoder_decoder":
        return EncoderDecoder(config)
    raise NotImplementedError(f"arch={config.arch!r} is not built yet; available: encoder_decoder")


__all__ = ["ModelConfig", "PRESETS", "build", "get_config"]
