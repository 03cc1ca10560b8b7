"""`t5lite convert` on input it cannot use: one line on stderr naming the input, exit code 2, nothing
written. The Hugging Face folders are written by t5lite itself (no torch needed), then broken."""
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import cli, models
from t5lite.interop import checkpoint, hf


def _fails(capsys, *argv) -> str:
    """Runs `t5lite convert ARGV` in this process; returns its stderr, which must be one error line."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["convert", *argv])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("t5lite: error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny GPT-2 folder as transformers' save_pretrained lays it out (config.json, model.safetensors)."""
    config = models.get_config("gpt2_tiny")
    tokens = jnp.zeros((1, 4), jnp.int32)
    module = models.build(config)
    shapes = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.key(0), decoder_input_tokens=tokens)))
    rng = np.random.default_rng(0)
    variables = jax.tree.map(lambda s: rng.normal(0, 0.02, s.shape).astype(np.float32), shapes)
    return hf.save(config, variables, str(tmp_path_factory.mktemp("hf") / "gpt2"))


def _copy(folder: str, to) -> str:
    to.mkdir()
    for name in os.listdir(folder):
        (to / name).write_bytes(open(os.path.join(folder, name), "rb").read())
    return str(to)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", ""])
def test_garbage_config_json(tmp_path, capsys, hf_folder, text):
    folder = _copy(hf_folder, tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text(text)
    err = _fails(capsys, "--from_hf", folder, "--out", str(tmp_path / "out"))
    assert os.path.join(folder, "config.json") in err and "config.json" in err
    assert not (tmp_path / "out").exists()


def test_config_json_without_a_field_the_family_needs(tmp_path, capsys, hf_folder):
    folder = _copy(hf_folder, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["n_embd"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    err = _fails(capsys, "--from_hf", folder, "--out", str(tmp_path / "out"))
    assert os.path.join(folder, "config.json") in err and "'n_embd'" in err


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_safetensors(tmp_path, capsys, hf_folder, damage):
    folder = _copy(hf_folder, tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2] if damage == "truncated" else b"\x00garbage" * 100)
    err = _fails(capsys, "--from_hf", folder, "--out", str(tmp_path / "out"))
    assert str(weights) in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_pytorch_bin(tmp_path, capsys, hf_folder, damage):
    torch = pytest.importorskip("torch", reason="a pytorch_model.bin is read with torch (extra 'hf')")
    from safetensors.numpy import load_file
    folder = _copy(hf_folder, tmp_path / "hf")
    weights = tmp_path / "hf" / "pytorch_model.bin"
    torch.save({k: torch.tensor(v) for k, v in load_file(os.path.join(folder, "model.safetensors")).items()}, weights)
    os.remove(os.path.join(folder, "model.safetensors"))
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2] if damage == "truncated" else b"garbage" * 100)
    err = _fails(capsys, "--from_hf", folder, "--out", str(tmp_path / "out"))
    assert str(weights) in err


def test_folder_without_weights(tmp_path, capsys, hf_folder):
    folder = _copy(hf_folder, tmp_path / "hf")
    os.remove(os.path.join(folder, "model.safetensors"))
    err = _fails(capsys, "--from_hf", folder, "--out", str(tmp_path / "out"))
    assert folder in err and "model.safetensors" in err and "pytorch_model.bin" in err


@pytest.mark.parametrize("model_type", ["llama", None])
def test_unsupported_model_type_names_the_supported_ones(tmp_path, capsys, hf_folder, model_type):
    folder = _copy(hf_folder, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["model_type"] = model_type
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    err = _fails(capsys, "--from_hf", folder, "--out", str(tmp_path / "out"))
    assert os.path.join(folder, "config.json") in err and repr(model_type) in err
    assert all(name in err for name in ("t5", "mt5", "bert", "roberta", "albert", "electra", "deberta-v2", "gpt2",
                                        "bart"))


def test_missing_folders(tmp_path, capsys):
    missing = str(tmp_path / "nowhere")
    err = _fails(capsys, "--from_hf", missing, "--out", str(tmp_path / "out"))
    assert f"{missing} does not exist" in err
    err = _fails(capsys, "--to_hf", missing, "--out", str(tmp_path / "out"))
    assert f"{missing} does not exist" in err
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, hf_folder):
    """A t5lite run imported from the GPT-2 folder."""
    run = tmp_path_factory.mktemp("runs") / "gpt2"
    checkpoint.hf_to_t5lite(hf_folder, str(run))
    return run


def _run_copy(run, tmp_path):
    import shutil
    return shutil.copytree(run, tmp_path / "run")


def test_to_hf_with_an_unknown_preset(tmp_path, capsys, run_dir):
    run = _run_copy(run_dir, tmp_path)
    os.remove(run / "model_config.json")
    err = _fails(capsys, "--to_hf", str(run), "--out", str(tmp_path / "out"), "--preset", "gpt2_tinyy")
    assert "--preset" in err and "'gpt2_tinyy'" in err and "gpt2_tiny" in err


def test_to_hf_with_a_preset_that_does_not_fit_the_checkpoint(tmp_path, capsys, run_dir):
    run = _run_copy(run_dir, tmp_path)
    os.remove(run / "model_config.json")
    err = _fails(capsys, "--to_hf", str(run), "--out", str(tmp_path / "out"), "--preset", "bert_tiny")
    assert str(run) in err and "--preset bert_tiny" in err
    assert not (tmp_path / "out").exists()


def test_to_hf_of_a_model_hugging_face_cannot_express(tmp_path, capsys, run_dir):
    run = _run_copy(run_dir, tmp_path)
    config = json.loads((run / "model_config.json").read_text())
    config["position_encoding"] = "rotary"
    (run / "model_config.json").write_text(json.dumps(config))
    err = _fails(capsys, "--to_hf", str(run), "--out", str(tmp_path / "out"))
    assert str(run) in err and "position_encoding='rotary'" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["{not json", '{"no_such_field": 1}'])
def test_to_hf_with_a_damaged_model_config(tmp_path, capsys, run_dir, text):
    run = _run_copy(run_dir, tmp_path)
    (run / "model_config.json").write_text(text)
    err = _fails(capsys, "--to_hf", str(run), "--out", str(tmp_path / "out"))
    assert str(run / "model_config.json") in err


def test_a_full_disk_keeps_nothing_of_out_and_the_same_command_then_works(tmp_path, capsys, hf_folder, monkeypatch):
    """The advice to rerun holds: --out is left as it was (here: absent), so the rerun is not refused."""
    import errno
    from etils import epath
    out = tmp_path / "out"
    write_text = epath.Path.write_text

    def full(self, *args, **kwargs):
        if os.fspath(self).startswith(str(out / "checkpoints")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(self))
        return write_text(self, *args, **kwargs)
    monkeypatch.setattr(epath.Path, "write_text", full)
    err = _fails(capsys, "--from_hf", hf_folder, "--out", str(out))
    assert f"no space left writing --out {out}; nothing was kept there" in err and "rerun the same command" in err
    assert not out.exists() and os.listdir(tmp_path) == []
    monkeypatch.undo()
    cli.main(["convert", "--from_hf", hf_folder, "--out", str(out)])
    assert not (out / checkpoint.PARTIAL_MARK).exists() and (out / "model_config.json").is_file()


def test_a_failure_into_an_empty_out_leaves_it_empty(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    _fails(capsys, "--from_hf", str(tmp_path / "nowhere"), "--out", str(out))
    assert out.is_dir() and os.listdir(out) == []


def test_the_partial_out_of_a_killed_convert_is_replaced_by_the_rerun(tmp_path, capsys, hf_folder, caplog):
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "half-written").write_text("x")
    (out / checkpoint.PARTIAL_MARK).write_text("")
    cli.main(["convert", "--from_hf", hf_folder, "--out", str(out)])
    assert (out / "model_config.json").is_file()
    assert not (out / "checkpoints" / "half-written").exists() and not (out / checkpoint.PARTIAL_MARK).exists()
    assert "partial output of a command that was stopped" in caplog.text


def test_out_holding_files_t5lite_did_not_mark_is_still_refused(tmp_path, capsys, hf_folder):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    err = _fails(capsys, "--from_hf", hf_folder, "--out", str(out))
    assert "already holds files (mine.txt)" in err and (out / "mine.txt").read_text() == "keep"
