"""Models: configs and presets, `build(config)` -> a Flax module, task heads and KV-cache helpers."""
from t5lite.models.awd_lstm import AWDLSTMLanguageModel
from t5lite.models.config import PRESETS, ModelConfig, get_config
from t5lite.models.recurrent import BiLMLanguageModel
from t5lite.models.transformer import (Decoder, Encoder, EncoderDecoder, build_module, init_cache, scan_params,
                                       set_cache_index, unscan_params)


def build(config: ModelConfig | str):
    """A Flax module for a config (or a preset name), chosen by `config.arch`; the recurrent
    families give their language models (t5lite.models.recurrent, awd_lstm)."""
    if isinstance(config, str):
        config = get_config(config)
    recurrent = {"bilm": BiLMLanguageModel, "awd_lstm": AWDLSTMLanguageModel}
    return recurrent[config.arch](config) if config.arch in recurrent else build_module(config)


__all__ = ["Decoder", "Encoder", "EncoderDecoder", "ModelConfig", "PRESETS", "build", "get_config", "init_cache",
           "scan_params", "set_cache_index", "unscan_params"]
