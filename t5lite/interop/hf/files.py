"""Hugging Face model folders on disk: config.json (plus the special ids of generation_config.json)
and the weights, as model.safetensors, its shards or a legacy pytorch_model.bin. A file that cannot
be read is an `HFConversionError` that names it. Only json and safetensors are needed; torch only
for a pytorch_model.bin, read with `weights_only=True`."""
from __future__ import annotations

import json
import os
import pickle

import numpy as np

from t5lite import storage
from t5lite.errors import first_line
from t5lite.interop.hf.fields import HFConversionError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
# What `generate` uses; transformers 5 keeps some ids only in generation_config.json.
GENERATION_IDS = ("decoder_start_token_id", "eos_token_id", "bos_token_id", "pad_token_id")
RESAVE = "write the folder again with transformers' save_pretrained"


def read_config(path: str) -> dict:
    """The folder's config.json, with generation_config.json's special ids over it."""
    refuse_remote(path, "Hugging Face model folders")
    if not os.path.isdir(path):
        raise HFConversionError(f"{path} does not exist; give a Hugging Face model folder (config.json with "
                                "model.safetensors or pytorch_model.bin, as save_pretrained writes)"
                                if not os.path.exists(path) else f"{path} is a file; give the model's folder")
    config_path = os.path.join(path, CONFIG)
    if not os.path.isfile(config_path):
        raise HFConversionError(f"{path} is not a Hugging Face model folder: it has no config.json (expected "
                                "config.json with model.safetensors or pytorch_model.bin, as save_pretrained writes)")
    config = _read_json(config_path)
    generation = os.path.join(path, "generation_config.json")
    if os.path.exists(generation):
        config.update({k: v for k, v in _read_json(generation).items() if k in GENERATION_IDS and v is not None})
    return config


def refuse_remote(path: str, folders: str) -> None:
    """Model and adapter folders are read with local file calls, so one in a bucket is refused
    with how to copy it (`folders` says which kind, for the message)."""
    if storage.is_remote(path):
        raise HFConversionError(f"{path} is in a bucket; t5lite reads {folders} from local disk: copy "
                                f"it first (gcloud storage cp -r {path} .) and give the local folder")


def _read_json(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            value = json.load(f)
    except ValueError as e:      # JSONDecodeError and UnicodeDecodeError
        raise HFConversionError(f"{path} is not valid JSON ({first_line(e)}); {RESAVE}") from None
    if not isinstance(value, dict):
        raise HFConversionError(f"{path} holds a JSON {type(value).__name__}, not an object of fields; {RESAVE}")
    return value


def read_tensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of a folder; old TF-converted names (LayerNorm gamma / beta) renamed as HF does."""
    legacy = {".gamma": ".weight", ".beta": ".bias"}
    rename = lambda k: next((k[:-len(old)] + new for old, new in legacy.items() if k.endswith(old)), k)
    return {rename(k): v for k, v in _read_weights(path).items()}


def _read_weights(path: str) -> dict[str, np.ndarray]:
    files = os.listdir(path)
    if WEIGHTS in files:
        return _read_safetensors(os.path.join(path, WEIGHTS))
    if "model.safetensors.index.json" in files:
        index = os.path.join(path, "model.safetensors.index.json")
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise HFConversionError(f"{index} has no weight_map of tensor names to shard files; {RESAVE}")
        return {k: v for shard in sorted(set(weight_map.values()))
                for k, v in _read_safetensors(os.path.join(path, shard)).items()}
    if "pytorch_model.bin" in files:
        return _read_pytorch(os.path.join(path, "pytorch_model.bin"))
    raise HFConversionError(f"{path} holds no weights: no model.safetensors, model.safetensors.index.json or "
                            f"pytorch_model.bin; {RESAVE}")


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    try:
        return dict(load_file(path))
    except (SafetensorError, OSError) as e:
        raise HFConversionError(f"{path} cannot be read as safetensors ({first_line(e)}); it may be truncated or "
                                f"damaged: download it again or {RESAVE}") from None


def _read_pytorch(path: str) -> dict[str, np.ndarray]:
    import torch  # only for legacy checkpoints; weights_only refuses arbitrary pickled objects
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        reason = _torch_reason(e)
        if "Unsupported global" in reason:
            raise HFConversionError(f"{path} holds pickled Python objects besides tensors, which t5lite does not run "
                                    f"(torch.load with weights_only=True: {reason}); {RESAVE}") from None
        raise HFConversionError(f"{path} cannot be read as a PyTorch state dict of tensors ({reason}); it may be "
                                f"truncated or damaged: download it again or {RESAVE}") from None
    if not isinstance(state, dict):
        raise HFConversionError(f"{path} holds a {type(state).__name__}, not a state dict of tensors; {RESAVE}")
    return {k: v.float().numpy() for k, v in state.items()}


def _torch_reason(error: Exception) -> str:
    """torch.load's paragraphs cut to the cause: the weights-only unpickler's own error when there is one."""
    text = str(error).split("WeightsUnpickler error:", 1)[-1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0].split(". ")[0] if lines else type(error).__name__


def write(out_dir: str, config: dict, tensors: dict[str, np.ndarray], config_name: str = CONFIG,
          weights_name: str = WEIGHTS) -> str:
    """config.json + model.safetensors, as transformers' `from_pretrained` reads them (other names:
    a peft adapter folder)."""
    from safetensors.numpy import save_file
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, config_name), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    save_file(tensors, os.path.join(out_dir, weights_name), metadata={"format": "pt"})
    return out_dir
