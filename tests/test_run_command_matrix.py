"""Every run kind with every command that takes a run: it works, or it is refused in one line that
says what the run is (exit 2). The fast tests walk the PEFT-with-a-task-head row end to end (the
shipped `minilm_lora_sst2.gin` recipe at tiny sizes): train, eval, export to peft with the head
and compare logits in transformers, merge, embed, analyse; and LoRA on a fine-tuned classifier."""
from __future__ import annotations

import json
import os

import gin
import numpy as np
import pytest

from conftest import REPO, shared_data_dir
from t5lite import cli

SST2 = str(REPO / "configs/local/bert_tiny_finetune_sst2.gin")
LORA = str(REPO / "gin/peft/lora.gin")


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def run_cli(argv, capsys=None) -> tuple[int, str]:
    """(exit code, stderr) of `t5lite ARGV` in this process (stderr with `capsys`)."""
    gin.clear_config()
    try:
        cli.main([str(a) for a in argv])
        code = 0
    except SystemExit as e:
        code = e.code
    gin.clear_config()
    return code, capsys.readouterr().err if capsys else ""


def _train_lora(model_dir, base, capsys=None) -> str:
    """2 LoRA steps of the tiny SST-2 classifier recipe on `base` (its head trained too)."""
    code, err = run_cli(["train", f"--gin_file={SST2}", f"--gin_file={LORA}", f"--gin.MODEL_DIR='{model_dir}'",
                         f"--gin.INITIAL_CHECKPOINT_PATH='{base}'", f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'",
                         "--gin.TRAIN_STEPS=2", "--gin.EVAL_EVERY=0", "--gin.BATCH_SIZE=8"], capsys)
    assert code == 0, err
    return str(model_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A random BERT (bert_tiny's shape, with pooler and NSP head) imported from Hugging Face, a
    LoRA-with-head run on it, and its merged copy."""
    torch = pytest.importorskip("torch", reason="the reference model is Hugging Face PyTorch (extras 'hf')")
    transformers = pytest.importorskip("transformers", reason="the reference model is Hugging Face's (extras 'hf')")
    root = tmp_path_factory.mktemp("matrix")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=2176, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64)
    transformers.BertForPreTraining(config).save_pretrained(root / "hf_base")
    assert run_cli(["convert", "--from_hf", root / "hf_base", "--out", root / "base"])[0] == 0
    lora = _train_lora(root / "lora_head", root / "base")
    assert run_cli(["convert", "--merge", lora, "--out", root / "merged"])[0] == 0
    return {"root": root, "base": str(root / "base"), "lora_head": lora, "merged": str(root / "merged")}


def _head_logits(run: str, tokens: np.ndarray) -> np.ndarray:
    """The run's classifier logits as t5lite computes them (the training model, pooler pooling)."""
    from t5lite.infer import predict
    from t5lite.objectives.finetune import ClassificationObjective
    config = predict.model_config_of(run, None)
    module = ClassificationObjective(num_labels=2, pooling="pooler").build_model(config)
    params, _, _ = predict.load_params(config, run, module=module)
    return np.asarray(module.apply({"params": params}, encoder_input_tokens=tokens,
                                   token_type_ids=np.zeros_like(tokens)))


TOKENS = np.random.default_rng(0).integers(3, 2000, size=(2, 12)).astype(np.int32)


def test_peft_head_run_exports_as_peft_seq_cls_with_the_same_logits(runs, tmp_path, capsys):
    torch = pytest.importorskip("torch", reason="the reference model is Hugging Face PyTorch (extras 'hf')")
    transformers = pytest.importorskip("transformers", reason="the reference model is Hugging Face's (extras 'hf')")
    peft = pytest.importorskip("peft", reason="peft loads the exported adapter (extras 'test')")
    out = tmp_path / "hf"
    code, err = run_cli(["convert", "--to_hf", runs["lora_head"], "--out", out], capsys)
    assert code == 0, err
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_CLS" and adapter["modules_to_save"] == ["classifier"]
    base = transformers.BertForSequenceClassification.from_pretrained(out / "base", num_labels=2)
    model = peft.PeftModel.from_pretrained(base, out / "adapter").eval()
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(TOKENS, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(_head_logits(runs["lora_head"], TOKENS), theirs, rtol=1e-4, atol=1e-5)


def test_failed_to_hf_leaves_nothing_and_the_rerun_succeeds(runs, tmp_path, capsys, monkeypatch):
    from t5lite.interop import hf

    def full_disk(*args, **kwargs):
        raise hf.HFConversionError("no space left on device")
    out = tmp_path / "hf"
    monkeypatch.setattr(hf, "save_adapter", full_disk)
    code, err = run_cli(["convert", "--to_hf", runs["lora_head"], "--out", out], capsys)
    assert code == 2 and "no space left" in err
    assert os.listdir(tmp_path) == []   # neither OUT/base nor a temporary folder
    monkeypatch.undo()
    assert run_cli(["convert", "--to_hf", runs["lora_head"], "--out", out], capsys)[0] == 0


def test_peft_head_run_merges_into_a_task_head_run(runs):
    from t5lite.infer.checkpoint_reader import stored_param_names
    assert stored_param_names(runs["merged"]) == {"backbone", "head"}
    np.testing.assert_allclose(_head_logits(runs["merged"], TOKENS), _head_logits(runs["lora_head"], TOKENS),
                               rtol=1e-5, atol=1e-6)


def test_peft_head_run_evaluates_embeds_and_analyses(runs, tmp_path, capsys):
    glue, run = shared_data_dir() / "glue", runs["lora_head"]
    code, err = run_cli(["eval", f"--gin_file={SST2}", f"--gin.CHECKPOINT_PATH='{run}'", f"--gin.DATA_DIR='{glue}'",
                         "--gin.eval.max_examples=16"], capsys)
    assert code == 0, err
    for source, name in ((run, "lora"), (runs["merged"], "merged")):
        code, err = run_cli(["embed", f"--gin.CHECKPOINT_PATH='{source}'", "--output", tmp_path / f"{name}.npy",
                             "The lobster is blue .", "It lives in the sea ."], capsys)
        assert code == 0, err
    lora, merged = np.load(tmp_path / "lora.npy"), np.load(tmp_path / "merged.npy")
    assert lora.shape == (2, 64) and np.isfinite(lora).all()
    np.testing.assert_allclose(lora, merged, rtol=1e-5, atol=1e-6)   # the same backbone, LoRA merged
    code, err = run_cli(["attention", "--model", run, "--data_dir", shared_data_dir() / "ud", "--sentences", 2,
                         "--out", tmp_path / "attention"], capsys)
    assert code == 0, err


def test_lora_on_a_fine_tuned_classifier(runs, tmp_path, capsys):
    """The merged run is a fine-tuned classifier; LoRA on it evaluates, merges and embeds, and its
    export is refused in one line that says what the run is."""
    run = _train_lora(tmp_path / "lora_on_classifier", runs["merged"], capsys)
    code, err = run_cli(["eval", f"--gin_file={SST2}", f"--gin.CHECKPOINT_PATH='{run}'",
                         f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'", "--gin.eval.max_examples=16"], capsys)
    assert code == 0, err
    assert run_cli(["convert", "--merge", run, "--out", tmp_path / "merged"], capsys)[0] == 0
    code, err = run_cli(["embed", f"--gin.CHECKPOINT_PATH='{run}'", "--output", tmp_path / "e.npy", "a sentence ."],
                        capsys)
    assert code == 0, err
    code, err = run_cli(["convert", "--to_hf", run, "--out", tmp_path / "hf"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "LoRA run with a task head" in err and "fine-tuned" in err
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("argv, says", [
    (["convert", "--quantize", "int8", "--from_run", "{lora_head}", "--out", "{tmp}/q"], "is a PEFT run"),
    (["convert", "--quantize", "int8", "--from_hf", "{root}/hf_base", "--peft_adapter", "{tmp}",
      "--out", "{tmp}/q"], "--peft_adapter is not quantised"),
    (["infer", "--gin.CHECKPOINT_PATH='{merged}'", "a prompt"], "is a task-head run"),
])
def test_misleading_messages_say_what_the_run_is(runs, tmp_path, capsys, argv, says):
    names = {**{k: str(v) for k, v in runs.items()}, "tmp": str(tmp_path)}
    code, err = run_cli([a.format(**names) for a in argv], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err


def test_an_int8_run_is_not_exported_to_hugging_face(runs, tmp_path, capsys):
    quantised = tmp_path / "q"
    code, err = run_cli(["convert", "--quantize", "int8", "--from_hf", runs["root"] / "hf_base", "--out", quantised],
                        capsys)
    assert code == 0, err
    code, err = run_cli(["convert", "--to_hf", quantised, "--out", tmp_path / "hf"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "is an int8-quantised run" in err and "export the float run" in err, err
    assert not (tmp_path / "hf").exists()


def test_a_peft_run_without_or_with_a_broken_peft_json(runs, tmp_path, capsys):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(runs["lora_head"], run)
    record = json.loads((run / "peft.json").read_text())
    (run / "peft.json").write_text(json.dumps({**record, "method": "DoRA"}))
    code, err = run_cli(["embed", f"--gin.CHECKPOINT_PATH='{run}'", "--output", tmp_path / "e.npy", "x"], capsys)
    assert code == 2 and "'DoRA' is not a PEFT method" in err, err
    (run / "peft.json").unlink()
    code, err = run_cli(["embed", f"--gin.CHECKPOINT_PATH='{run}'", "--output", tmp_path / "e.npy", "x"], capsys)
    assert code == 2 and "has no peft.json" in err and "another model" not in err, err



@pytest.fixture(scope="module")
def elmo_run(tmp_path_factory):
    """allennlp's ELMo test fixture imported as a t5lite run."""
    elmo_dir, out = shared_data_dir() / "elmo", tmp_path_factory.mktemp("elmo") / "run"
    assert run_cli(["convert", "--from_elmo", elmo_dir / "lm_weights.hdf5", "--elmo_options",
                    elmo_dir / "options.json", "--out", out])[0] == 0
    return str(out)


@pytest.mark.parametrize("argv", [
    ["infer", "--gin.CHECKPOINT_PATH='{run}'", "a prompt"],
    ["eval", "--gin.CHECKPOINT_PATH='{run}'"],
    ["attention", "--model", "{run}", "--data_dir", "{tmp}", "--out", "{tmp}/a"],
    ["probe", "--model", "{run}", "--cross_lingual", "--out", "{tmp}/p"],
])
def test_an_elmo_run_is_refused_by_commands_for_transformers(elmo_run, tmp_path, capsys, argv):
    """Before any work, in one line that says what the run is and which commands read it."""
    code, err = run_cli([a.format(run=elmo_run, tmp=tmp_path) for a in argv], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "is an ELMo run" in err and "`t5lite embed`" in err and "Traceback" not in err, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "p").exists()


# The full matrix (slow): each run kind t5lite writes, built tiny, with each command that takes a run.
GLUE = shared_data_dir() / "glue"
T5_PRETRAIN = str(REPO / "configs/local/t5_tiny_pretrain.gin")
TINY_T5 = ["--gin.TRAIN_STEPS=1", "--gin.BATCH_SIZE=4", "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}",
           "--gin.train.eval_every=0"]
# What a refusal must say the run is, per kind.
KIND_WORDS = {"pretrained": "encoder_decoder|not a PEFT|t5|text-to-text", "task_head": "task-head|encoder",
              "peft": "PEFT|LoRA|encoder_decoder", "peft_head": "PEFT|LoRA|encoder",
              "peft_on_classifier": "PEFT|LoRA|encoder",
              "quantised": "quantised|encoder_decoder", "pruned": "task-head|encoder", "distilled": "encoder",
              "elmo": "ELMo", "awd_lstm": "AWD-LSTM|awd_lstm", "word2vec": "word2vec"}

COMMANDS = {
    "eval": lambda run, recipe, out: ["eval", *recipe, f"--gin.CHECKPOINT_PATH='{run}'", "--gin.eval.max_examples=8"],
    "infer": lambda run, recipe, out: ["infer", f"--gin.CHECKPOINT_PATH='{run}'", "a short input"],
    "embed": lambda run, recipe, out: ["embed", f"--gin.CHECKPOINT_PATH='{run}'", "--output", out / "e.npy",
                                       "a short input ."],
    "probe": lambda run, recipe, out: ["probe", "--model", run, "--data_dir", shared_data_dir() / "ud",
                                       "--train_sentences", 8, "--test_sentences", 4, "--epochs", 1, "--no_control",
                                       "--out", out / "probe"],
    "attention": lambda run, recipe, out: ["attention", "--model", run, "--data_dir", shared_data_dir() / "ud",
                                           "--sentences", 2, "--out", out / "attention"],
    "neighbours": lambda run, recipe, out: ["probe", "--model", run, "--neighbours", "the", "--corpus",
                                            out / "corpus.txt", "--k", 2, "--no_control", "--out", out / "nb"],
    "to_hf": lambda run, recipe, out: ["convert", "--to_hf", run, "--out", out / "hf"],
    "merge": lambda run, recipe, out: ["convert", "--merge", run, "--out", out / "merged"],
    "quantize": lambda run, recipe, out: ["convert", "--quantize", "int8", "--from_run", run, "--out", out / "q"],
    "to_elmo": lambda run, recipe, out: ["convert", "--to_elmo", run, "--out", out / "elmo"],
}


@pytest.fixture(scope="module")
def kinds(runs, bert_tiny_sst2_run, tmp_path_factory):
    """{kind: (run, the gin flags `t5lite eval` takes for it)}, each run built on first use."""
    root = tmp_path_factory.mktemp("kinds")
    sst2 = [f"--gin_file={SST2}", f"--gin.DATA_DIR='{GLUE}'"]
    t5 = [f"--gin_file={T5_PRETRAIN}"]
    awd_lstm = [f"--gin_file={REPO / 'configs/local/awd_lstm_tiny_wikitext2.gin'}", "--gin.DATA_DIR=None",
                "--gin.MIXTURE_OR_TASK_NAME='embedded_docs_lines'", "--gin.word_vocabulary.task='embedded_docs_lines'",
                "--gin.word_vocabulary.split='train'", "--gin.word_vocabulary.size=512",
                "--gin.model_config.vocab_size=512", "--gin.TASK_FEATURE_LENGTHS={'targets': 16}",
                "--gin.BATCH_SIZE=8"]   # eval's rows too: the LM's carried state has a row per stream

    def train(name, *argv):
        code, err = run_cli(["train", f"--gin.MODEL_DIR='{root / name}'", *argv])
        assert code == 0, err
        return str(root / name)

    def pretrained():
        return train("pretrained", *t5, *TINY_T5)

    def elmo():
        elmo_dir = shared_data_dir() / "elmo"
        assert run_cli(["convert", "--from_elmo", elmo_dir / "lm_weights.hdf5", "--elmo_options",
                        elmo_dir / "options.json", "--out", root / "elmo"])[0] == 0
        return str(root / "elmo")

    def quantised():
        assert run_cli(["convert", "--quantize", "int8", "--from_run", built("pretrained")[0],
                        "--out", root / "quantised"])[0] == 0
        return str(root / "quantised")

    builders = {
        "pretrained": lambda: (pretrained(), t5),
        "task_head": lambda: (bert_tiny_sst2_run, sst2),
        "peft": lambda: (train("peft", *t5, f"--gin_file={LORA}", *TINY_T5,
                               f"--gin.train.initial_checkpoint_path='{built('pretrained')[0]}'"),
                         [*t5, f"--gin_file={LORA}"]),
        "peft_head": lambda: (runs["lora_head"], sst2),
        "peft_on_classifier": lambda: (_train_lora(root / "peft_on_classifier", runs["merged"]), sst2),
        "quantised": lambda: (quantised(), t5),
        "pruned": lambda: (train("pruned", f"--gin_file={SST2}", "--prune_heads", "0.25",
                                 f"--gin.INITIAL_CHECKPOINT_PATH='{bert_tiny_sst2_run}'", f"--gin.DATA_DIR='{GLUE}'",
                                 "--gin.TRAIN_STEPS=1", "--gin.EVAL_EVERY=0", "--gin.BATCH_SIZE=8",
                                 "--gin.HeadPruning.batches=2"), sst2),
        "distilled": lambda: (train("distilled", f"--gin_file={REPO / 'configs/local/bert_tiny_pretrain.gin'}",
                                    f"--gin_file={REPO / 'gin/objectives/distilbert.gin'}",
                                    f"--gin.TEACHER_PATH='{runs['base']}'",
                                    "--gin.DistillationObjective.student_layers=[0, 1]",
                                    "--gin.TRAIN_STEPS=1", "--gin.BATCH_SIZE=4", "--gin.train.eval_every=0"),
                              [f"--gin_file={REPO / 'configs/local/bert_tiny_pretrain.gin'}"]),
        "elmo": lambda: (elmo(), []),
        "awd_lstm": lambda: (train("awd_lstm", *awd_lstm, "--gin.TRAIN_STEPS=1",
                                   "--gin.train.eval_every=0", "--gin.train.train_split='train'",
                                   "--gin.warmup_cosine.warmup_steps=1"), [*awd_lstm, "--gin.eval.batch_size=8"]),
        "word2vec": lambda: (train("word2vec", f"--gin_file={REPO / 'configs/local/word2vec_wikitext2.gin'}",
                                   f"--gin.DATA_DIR='{shared_data_dir()}'", "--gin.TRAIN_STEPS=3", "--gin.BATCH_SIZE=4",
                                   "--gin.model_config.overrides={'dim': 8}"), []),
    }
    cache = {}

    def built(kind):
        if kind not in cache:
            cache[kind] = builders[kind]()
        return cache[kind]
    return built


ERROR = "t5lite: error:"


def assert_works_or_is_refused(kind, command, run, recipe, out, capsys) -> int:
    """`t5lite COMMAND` on a run of `kind` (outputs under `out`) exits 0, or 2 with one line that says
    what the run is (never that it, or its base, is missing); its exit code."""
    import re
    (out / "corpus.txt").write_text("the sea is blue .\nthe lobster lives in the sea .\n")
    code, err = run_cli(COMMANDS[command](run, recipe, out), capsys)
    assert code in (0, 2) and "Traceback" not in err, err
    if code == 2:   # progress bars aside, one line that says what the run is
        lines = [line for line in err.splitlines() if line.startswith(ERROR)]
        said = lines[0][len(ERROR):].replace(str(run), "RUN") if len(lines) == 1 else ""   # in words, not by its path
        assert re.search(KIND_WORDS[kind], said) and not re.search("does not exist|is gone", said), lines
    return code


def every_kind_with_every_command(test):
    """The slow walk's cells (a local run or its copy in a bucket): each run kind with each command."""
    cells = pytest.mark.parametrize("command", COMMANDS)(pytest.mark.parametrize("kind", KIND_WORDS)(test))
    return pytest.mark.slow(cells)


@every_kind_with_every_command
def test_every_run_kind_with_every_command(kinds, kind, command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)   # the recipes include gin files by repository paths
    assert_works_or_is_refused(kind, command, *kinds(kind), tmp_path, capsys)
