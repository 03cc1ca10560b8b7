"""Hugging Face peft LoRA folders in t5lite (t5lite.interop.hf.adapter, t5lite.models.peft.LoRA)
against real peft on tiny BERT and GPT-2 models: every LoraConfig field is honoured (peft's logits
after import and after export) or refused in one line naming it; `convert --from_hf --peft_adapter`
makes a PEFT run that goes back out as a peft folder with peft's logits, merges (`convert --merge`)
to peft's merge_and_unload, and trains further on its frozen base."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models import peft as P

torch = pytest.importorskip("torch", reason="peft parity tests need torch (extras 'hf')")
transformers = pytest.importorskip("transformers", reason="peft parity tests need transformers (extras 'hf')")
peft = pytest.importorskip("peft", reason="peft parity tests need peft (extras 'hf')")

from t5lite import cli  # noqa: E402
from t5lite.interop import hf  # noqa: E402
from t5lite.interop.hf import adapter as adapter_lib  # noqa: E402
from conftest import assert_close, nonzero_lora_b  # noqa: E402

V, RTOL = 97, 1e-4


def _bert():
    config = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40)
    ids = np.random.RandomState(2).randint(3, V, (2, 11))
    return transformers.BertForMaskedLM(config), dict(input_ids=ids), dict(encoder_input_tokens=ids)


def _gpt2():
    config = transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=3, n_head=4, n_positions=40, bos_token_id=0,
                                     eos_token_id=0)
    ids = np.random.RandomState(3).randint(1, V, (2, 10))
    return transformers.GPT2LMHeadModel(config), dict(input_ids=ids), dict(decoder_input_tokens=ids)


def _torch_logits(model, inputs):
    with torch.no_grad():
        return model(**{k: torch.tensor(v) for k, v in inputs.items()}).logits.numpy()


def _ours(module, params, features):
    return np.asarray(jax.jit(module.apply)({"params": params}, **{k: jnp.asarray(v) for k, v in features.items()}))


def _peft_adapter(make, lora_config, tmp_path):
    """(base folder, peft model with random B (and LoRA biases), torch inputs, t5lite features, adapter folder)."""
    torch.manual_seed(0)
    model, torch_inputs, features = make()
    model.eval().save_pretrained(str(tmp_path / "base"))
    peft_model = peft.get_peft_model(model, lora_config).eval()
    nonzero_lora_b(peft_model)
    peft_model.save_pretrained(str(tmp_path / "adapter"))
    return str(tmp_path / "base"), peft_model, torch_inputs, features, str(tmp_path / "adapter")


# Each case sets LoraConfig fields that change the adapter's meaning or placement.
CASES = {
    "rank_pattern": (_bert, dict(r=4, lora_alpha=8, target_modules=["query", "value"],
                                 rank_pattern={"layer.1.attention.self.query": 2, "value": 6})),
    "alpha_pattern": (_bert, dict(r=4, lora_alpha=8, target_modules=["query", "value", "dense"],
                                  alpha_pattern={"encoder.layer.2.output.dense": 32, "query": 2})),
    "lora_bias": (_bert, dict(r=4, lora_alpha=8, target_modules=["query", "value"], lora_bias=True)),
    "layers_to_transform": (_bert, dict(r=4, lora_alpha=8, target_modules=["query", "value"],
                                        layers_to_transform=[0, 2], layers_pattern="layer")),
    "regex_target_modules": (_bert, dict(r=4, lora_alpha=8, target_modules=r".*layer\.[12]\.attention\.self\.key")),
    "rslora": (_bert, dict(r=4, lora_alpha=8, target_modules=["query", "value"], use_rslora=True,
                           rank_pattern={"value": 9}, alpha_pattern={"query": 3})),
    "gpt2_fused_patterns": (_gpt2, dict(r=4, lora_alpha=8, target_modules=r"transformer\.h\.[02]\.attn\.c_attn",
                                        rank_pattern={"h.2.attn.c_attn": 2}, lora_bias=True, fan_in_fan_out=True)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lora_config_fields_give_peft_logits_both_ways(case, tmp_path):
    """peft's logits after import (merged, and unmerged as training runs it), a t5lite LoRA config
    that builds exactly the imported tree (so the run trains further), and peft's logits again
    after export of the imported adapter."""
    make, fields = CASES[case]
    base_dir, peft_model, torch_inputs, features, adapter_dir = _peft_adapter(make, peft.LoraConfig(**fields),
                                                                              tmp_path)
    ref = _torch_logits(peft_model, torch_inputs)
    with peft_model.disable_adapter():
        assert not np.allclose(ref, _torch_logits(peft_model, torch_inputs), rtol=RTOL)
    module, variables = hf.load(base_dir)
    base = variables["params"]
    method, trained = hf.load_adapter(adapter_dir, module)
    assert_close(_ours(module, method.combine(base, trained), features), ref, RTOL)
    params, context = method.for_training(base, trained)
    with context:
        assert_close(_ours(module, params, features), ref, RTOL)
    fresh, _ = method.init(jax.random.PRNGKey(0), base, P.logical_specs(module), module.config)
    shapes = lambda tree: jax.tree.map(np.shape, tree)
    assert shapes(fresh) == shapes(trained)
    out = hf.save_adapter(module, method, trained, str(tmp_path / "out"), base_dir)
    loaded = peft.PeftModel.from_pretrained(type(peft_model.base_model.model).from_pretrained(base_dir).eval(),
                                            out).eval()
    assert_close(_torch_logits(loaded, torch_inputs), ref, RTOL)


def test_every_lora_config_field_is_honoured_or_refused():
    """Every field of peft's LoraConfig, PromptTuningConfig and PrefixTuningConfig is in exactly
    one of t5lite's sets, so a field a new peft adds fails here until it is classified."""
    for config, honoured, refused in ((peft.LoraConfig, adapter_lib.LORA_HONOURED, adapter_lib.LORA_REFUSED),
                                      (peft.PromptTuningConfig, adapter_lib.PROMPT_HONOURED, adapter_lib.PROMPT_REFUSED),
                                      (peft.PrefixTuningConfig, adapter_lib.PREFIX_HONOURED, adapter_lib.PROMPT_REFUSED)):
        for field in dataclasses.fields(config):
            assert (field.name in honoured) != (field.name in refused), f"{config.__name__}.{field.name}"


@pytest.mark.parametrize("field,value", [(f, "x") for f in sorted(adapter_lib.LORA_REFUSED)] +
                         [("init_lora_weights", "pissa"), ("init_lora_weights", "pissa_niter_4"),
                          ("init_lora_weights", "olora"), ("init_lora_weights", "loftq"), ("a_new_field", [1])])
def test_refused_lora_fields_are_named_in_one_line(field, value, tmp_path):
    _, _, _, _, adapter_dir = _peft_adapter(_bert, peft.LoraConfig(r=2, target_modules=["query"]), tmp_path)
    module, _ = hf.load(str(tmp_path / "base"))
    config_path = tmp_path / "adapter" / adapter_lib.ADAPTER_CONFIG
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, field: value}))
    with pytest.raises(hf.HFConversionError, match=rf"^[^\n]*{field}=") as e:
        hf.load_adapter(adapter_dir, module)
    assert "\n" not in str(e.value)


def test_lora_bias_on_a_target_without_bias_is_refused(tmp_path):
    config = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    model = transformers.T5ForConditionalGeneration(config)
    model.save_pretrained(str(tmp_path / "base"))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # peft warns that such a LoRA cannot merge
        peft.get_peft_model(model, peft.LoraConfig(r=2, lora_bias=True)).save_pretrained(str(tmp_path / "adapter"))
    module, _ = hf.load(str(tmp_path / "base"))
    with pytest.raises(hf.HFConversionError, match="lora_bias=True.*no bias"):
        hf.load_adapter(str(tmp_path / "adapter"), module)


def test_imported_lora_is_a_peft_run_that_exports_merges_and_trains(tmp_path):
    """`convert --from_hf BASE --peft_adapter DIR` writes a PEFT run (A and B, the base by path and
    fingerprint); `convert --to_hf` of it is a peft folder with peft's logits; `convert --merge`
    gives peft's merge_and_unload logits; one more train step moves A and B, not the base."""
    from t5lite.infer import checkpoint_reader, peft_checkpoint
    fields = dict(r=4, lora_alpha=8, target_modules=["c_attn"], rank_pattern={"h.1.attn.c_attn": 2}, lora_bias=True,
                  fan_in_fan_out=True)
    base_dir, peft_model, torch_inputs, features, adapter_dir = _peft_adapter(_gpt2, peft.LoraConfig(**fields),
                                                                              tmp_path)
    ref = _torch_logits(peft_model, torch_inputs)
    run = str(tmp_path / "run")
    cli.main(["convert", "--from_hf", base_dir, "--peft_adapter", adapter_dir, "--out", run])
    record = peft_checkpoint.read(run)
    assert record["method"] == "LoRA" and record["base_checkpoint"].startswith(str(tmp_path / "run" / "base"))
    assert peft_checkpoint.imported(run)
    module, variables = hf.load(base_dir)
    assert record["base_fingerprint"] == peft_checkpoint.fingerprint(variables["params"])
    trained = peft_checkpoint.restore_trained(checkpoint_reader.step_directory(run))
    assert set(trained) == {"lora"} or not trained.get("params")
    method = peft_checkpoint.method_of(record)
    assert_close(_ours(module, method.combine(variables["params"], trained), features), ref, RTOL)

    cli.main(["convert", "--to_hf", run, "--out", str(tmp_path / "hf")])
    fresh = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf" / "base")).eval()
    loaded = peft.PeftModel.from_pretrained(fresh, str(tmp_path / "hf" / "adapter")).eval()
    assert_close(_torch_logits(loaded, torch_inputs), ref, RTOL)

    cli.main(["convert", "--merge", run, "--out", str(tmp_path / "merged")])
    merged = checkpoint_reader.restore_params(str(tmp_path / "merged"), variables["params"])
    assert_close(_ours(module, merged, features), _torch_logits(peft_model.merge_and_unload(), torch_inputs), RTOL)

    # One more step on the frozen base (a train state of the recorded method, A and B imported).
    import optax
    from t5lite.train.partitioning import Partitioner
    from t5lite.train.step import TrainTask
    tokens = np.random.RandomState(0).randint(1, V, (4, 9))
    batch = {"decoder_input_tokens": tokens[:, :-1], "decoder_target_tokens": tokens[:, 1:],
             "decoder_loss_weights": np.ones((4, 8))}
    batch = {k: jnp.asarray(v, jnp.float32 if "weights" in k else jnp.int32) for k, v in batch.items()}
    task = TrainTask(module.config.replace(dropout_rate=0.0), optax.adam(1e-2), optax.constant_schedule(1e-2),
                     Partitioner(), {k: 8 for k in batch}, peft=method)
    frozen = task.init_base(0, variables["params"])
    _assert_one_step_trains_the_import_only(task, frozen, run, trained, batch)
    jax.tree.map(np.testing.assert_array_equal, frozen, variables["params"])


def _assert_one_step_trains_the_import_only(task, frozen, run, trained, batch):
    """The imported run starts from its saved trainable params, and one step moves every one of them
    (the caller checks that the frozen base stayed as loaded)."""
    from t5lite.infer import peft_checkpoint
    state = peft_checkpoint.start_from_import(run, task.init_state(0, frozen))
    jax.tree.map(np.testing.assert_array_equal, state.params, trained)
    state, metrics = task.jit_train_step(frozen)(state, batch)
    assert np.isfinite(metrics["loss"])
    moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), state.params, trained)
    assert jax.tree.leaves(moved) and all(jax.tree.leaves(moved))


@pytest.mark.slow   # fast sibling: the TrainTask step in test_imported_lora_is_a_peft_run_that_exports_merges_and_trains
def test_t5lite_train_continues_an_imported_lora(tmp_path, micro_config):
    """`t5lite train` with MODEL_DIR an imported LoRA run (train.peft the method in its peft.json,
    the base its RUN/base) starts from the imported A and B, trains on, and keeps the base."""
    from conftest import train_tiny
    from t5lite.infer import checkpoint_reader, peft_checkpoint
    train_tiny(tmp_path / "t5", micro_config, 1)
    cli.main(["convert", "--to_hf", str(tmp_path / "t5"), "--out", str(tmp_path / "hf")])
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "hf")).eval()
    peft_model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, rank_pattern={"v": 2}))
    nonzero_lora_b(peft_model)
    peft_model.save_pretrained(str(tmp_path / "adapter"))
    run = tmp_path / "run"
    cli.main(["convert", "--from_hf", str(tmp_path / "hf"), "--peft_adapter", str(tmp_path / "adapter"),
              "--out", str(run)])
    method = peft_checkpoint.method_of(peft_checkpoint.read(str(run)))
    imported = peft_checkpoint.restore_trained(checkpoint_reader.step_directory(str(run)))
    train_tiny(run, micro_config, 2, peft=method, initial_checkpoint_path=str(run / "base"))
    assert checkpoint_reader.step_directory(str(run)).endswith("2")
    trained = peft_checkpoint.restore_trained(checkpoint_reader.step_directory(str(run)))
    assert jax.tree.map(np.shape, trained) == jax.tree.map(np.shape, imported)
    # moved from the imported values by two small steps (not re-initialised: B stays far from zero)
    for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(imported)):
        assert not np.array_equal(a, b) and np.allclose(a, b, atol=0.2)


LABELS = 3


def _seq_cls_adapter(tmp_path, modules_to_save=None):
    """(base folder, peft SEQ_CLS model with random B and a trained classifier (and pooler, when
    saved), input ids, adapter folder) of a tiny BertForSequenceClassification."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40, num_labels=LABELS)
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(str(tmp_path / "base"))
    lora_config = peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query", "value"],
                                  rank_pattern={"layer.1.attention.self.value": 2},
                                  modules_to_save=list(modules_to_save or []) or None)   # peft extends it
    peft_model = peft.get_peft_model(model, lora_config).eval()
    nonzero_lora_b(peft_model)
    with torch.no_grad():   # the saved modules as training leaves them: not the base's
        for name, p in peft_model.named_parameters():
            if "modules_to_save.default" in name:
                p.add_(torch.randn_like(p))
    peft_model.save_pretrained(str(tmp_path / "adapter"))
    ids = np.random.RandomState(4).randint(3, V, (2, 11))
    return str(tmp_path / "base"), peft_model, ids, str(tmp_path / "adapter")


def _classifier_logits(run: str, ids) -> np.ndarray:
    """A PEFT run's logits as t5lite's classifier on the pooler computes them (eval's model and
    params: predict.load_params less its vocabulary check, the tiny model's 97 rows being no task's)."""
    from t5lite.infer import checkpoint_reader, peft_checkpoint, predict
    from t5lite.objectives.finetune import ClassificationObjective
    config = predict.model_config_of(run, None)
    module = ClassificationObjective(num_labels=LABELS, pooling="pooler").build_model(config)
    params = peft_checkpoint.restore_merged(checkpoint_reader.step_directory(run), run, peft_checkpoint.read(run),
                                            predict.abstract_params(config, None, module))
    return np.asarray(module.apply({"params": params}, encoder_input_tokens=jnp.asarray(ids),
                                   token_type_ids=jnp.zeros(ids.shape, jnp.int32)))


@pytest.mark.parametrize("saved", [None, ["pooler"]])
def test_imported_seq_cls_lora_is_a_head_run_with_peft_logits(saved, tmp_path):
    """A peft SEQ_CLS LoRA (its classifier, and the pooler when named, in modules_to_save) imports
    as a PEFT run of a task-head model: the base by path and fingerprint, A and B kept, the saved
    modules trained head parameters; its logits are peft's."""
    from t5lite.infer import checkpoint_reader, peft_checkpoint
    base_dir, peft_model, ids, adapter_dir = _seq_cls_adapter(tmp_path, saved)
    run = str(tmp_path / "run")
    cli.main(["convert", "--from_hf", base_dir, "--peft_adapter", adapter_dir, "--out", run])
    record = peft_checkpoint.read(run)
    _, variables = hf.load(base_dir)
    assert record["base_fingerprint"] == peft_checkpoint.fingerprint(variables["params"])
    method = peft_checkpoint.method_of(record)
    assert method.modules_to_save == ("head",) + tuple(saved or ())
    trained = peft_checkpoint.restore_trained(checkpoint_reader.step_directory(run))
    assert set(trained["params"]) == ({"head", "backbone"} if saved else {"head"}) and set(trained["lora"]) == {
        "backbone"}
    assert_close(_classifier_logits(run, ids), _torch_logits(peft_model, dict(input_ids=ids)), RTOL)


def _adapter_tensors(folder) -> dict:
    from safetensors.numpy import load_file
    return load_file(str(folder / adapter_lib.ADAPTER_WEIGHTS))


def test_seq_cls_lora_export_import_export_keeps_the_tensors(tmp_path):
    """t5lite export -> import -> export of a SEQ_CLS LoRA run gives the same adapter tensors and
    config, and peft's logits on the export are the original adapter's."""
    base_dir, peft_model, ids, adapter_dir = _seq_cls_adapter(tmp_path, ["pooler"])
    cli.main(["convert", "--from_hf", base_dir, "--peft_adapter", adapter_dir, "--out", str(tmp_path / "run")])
    cli.main(["convert", "--to_hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf1")])
    hf1 = tmp_path / "hf1"
    cli.main(["convert", "--from_hf", str(hf1 / "base"), "--peft_adapter", str(hf1 / "adapter"),
              "--out", str(tmp_path / "run2")])
    cli.main(["convert", "--to_hf", str(tmp_path / "run2"), "--out", str(tmp_path / "hf2")])
    first, second = _adapter_tensors(tmp_path / "hf1" / "adapter"), _adapter_tensors(tmp_path / "hf2" / "adapter")
    assert first.keys() == second.keys() and any(k.endswith("bert.pooler.dense.weight") for k in first)
    for key in first:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)
    configs = [json.loads((tmp_path / d / "adapter" / adapter_lib.ADAPTER_CONFIG).read_text()) for d in ("hf1", "hf2")]
    assert [{k: v for k, v in c.items() if k != "base_model_name_or_path"} for c in configs] == [
        {k: v for k, v in configs[0].items() if k != "base_model_name_or_path"}] * 2
    assert configs[0]["task_type"] == "SEQ_CLS" and set(configs[0]["modules_to_save"]) == {"classifier", "pooler"}
    base = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "hf1" / "base"),
                                                                      num_labels=LABELS)
    loaded = peft.PeftModel.from_pretrained(base, str(tmp_path / "hf1" / "adapter")).eval()
    assert_close(_torch_logits(loaded, dict(input_ids=ids)), _torch_logits(peft_model, dict(input_ids=ids)), RTOL)


def test_imported_seq_cls_lora_trains_its_lora_and_head(tmp_path):
    """One train step of the classifier objective on an imported SEQ_CLS run starts from its A, B
    and head, moves all of them, and leaves the frozen base as it is."""
    import optax
    from t5lite.infer import checkpoint_reader, peft_checkpoint
    from t5lite.objectives.finetune import ClassificationObjective
    from t5lite.train.partitioning import Partitioner
    from t5lite.train.step import TrainTask
    base_dir, _, ids, adapter_dir = _seq_cls_adapter(tmp_path, ["pooler"])
    run = str(tmp_path / "run")
    cli.main(["convert", "--from_hf", base_dir, "--peft_adapter", adapter_dir, "--out", run])
    method = peft_checkpoint.method_of(peft_checkpoint.read(run))
    trained = peft_checkpoint.restore_trained(checkpoint_reader.step_directory(run))
    module, variables = hf.load(base_dir)
    batch = {"encoder_input_tokens": jnp.asarray(ids, jnp.int32), "token_type_ids": jnp.zeros(ids.shape, jnp.int32),
             "label": jnp.asarray([[0], [2]], jnp.int32)}   # [batch, 1], as the batch sharding takes it
    task = TrainTask(module.config.replace(dropout_rate=0.0), optax.adam(1e-2), optax.constant_schedule(1e-2),
                     Partitioner(), {k: ids.shape[1] for k in batch}, peft=method,
                     objective=ClassificationObjective(num_labels=LABELS, pooling="pooler"))
    frozen = task.init_base(0, {"backbone": variables["params"], "head": None})
    _assert_one_step_trains_the_import_only(task, frozen, run, trained, batch)
    jax.tree.map(np.testing.assert_array_equal, frozen["backbone"], variables["params"])


@pytest.mark.parametrize("make,saved,module", [("bert", ["embeddings"], "bert.embeddings"),
                                               ("gpt2", None, "score")])
def test_modules_to_save_beyond_the_classifier_is_refused_naming_it(make, saved, module, tmp_path, capsys):
    """A saved module that is not BERT's classifier or pooler (a part of the base, GPT-2's `score`
    head) is refused in one line naming it and why, before OUT is written."""
    torch.manual_seed(0)
    if make == "bert":
        base_dir, _, _, adapter_dir = _seq_cls_adapter(tmp_path, saved)
    else:
        config = transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=40,
                                         pad_token_id=0, num_labels=LABELS)
        model = transformers.GPT2ForSequenceClassification(config)
        base_dir, adapter_dir = str(tmp_path / "base"), str(tmp_path / "adapter")
        model.save_pretrained(base_dir)
        peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS", r=2)).save_pretrained(adapter_dir)
    with pytest.raises(SystemExit) as e:
        cli.main(["convert", "--from_hf", base_dir, "--peft_adapter", adapter_dir, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and f"saves {module!r}" in err and "beside a LoRA: " in err
    assert not (tmp_path / "run").exists()
    with pytest.raises(hf.HFConversionError, match="import it as a run" if make == "bert" else f"saves {module!r}"):
        hf.load(base_dir, adapter=adapter_dir if make == "gpt2" else _seq_cls_adapter(tmp_path / "ok")[3])


@pytest.mark.slow   # fast sibling: test_imported_seq_cls_lora_trains_its_lora_and_head
def test_t5lite_train_continues_an_imported_seq_cls_lora(tmp_path):
    """`t5lite train` of the shipped LoRA SST-2 classifier recipe with MODEL_DIR an imported peft
    SEQ_CLS adapter (on a base of bert_tiny's shape) trains on from its A, B and classifier."""
    import gin
    from conftest import REPO, shared_data_dir
    from t5lite.infer import checkpoint_reader, peft_checkpoint
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=2176, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64, num_labels=2)
    model = transformers.BertForSequenceClassification(config)
    model.save_pretrained(str(tmp_path / "base"))
    peft_model = peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=8))
    nonzero_lora_b(peft_model)
    peft_model.save_pretrained(str(tmp_path / "adapter"))
    run = tmp_path / "run"
    cli.main(["convert", "--from_hf", str(tmp_path / "base"), "--peft_adapter", str(tmp_path / "adapter"),
              "--out", str(run)])
    imported = peft_checkpoint.restore_trained(checkpoint_reader.step_directory(str(run)))
    gin.clear_config()
    try:
        cli.main(["train", f"--gin_file={REPO / 'configs/local/bert_tiny_finetune_sst2.gin'}",
                  f"--gin_file={REPO / 'gin/peft/lora.gin'}", f"--gin.MODEL_DIR='{run}'",
                  f"--gin.INITIAL_CHECKPOINT_PATH='{run / 'base'}'", f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'",
                  "--gin.TRAIN_STEPS=2", "--gin.EVAL_EVERY=0", "--gin.BATCH_SIZE=8"])   # step 0's warmup rate is 0
    finally:
        gin.clear_config()
    assert checkpoint_reader.step_directory(str(run)).endswith("2")
    trained = peft_checkpoint.restore_trained(checkpoint_reader.step_directory(str(run)))
    assert jax.tree.map(np.shape, trained) == jax.tree.map(np.shape, imported)
    for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(imported)):   # small steps from the import
        assert not np.array_equal(a, b) and np.allclose(a, b, atol=0.05)


def test_head_run_from_before_base_param_names_reads_its_base(tmp_path):
    """A PEFT head run whose peft.json predates `base_params` reads its base as a newer one does
    (the names recovered from the base checkpoint, checked by the fingerprint) for the task-head
    model and for an embedding's encoder alone; a base that matches no reading is refused saying so."""
    from t5lite.infer import checkpoint_reader, peft_checkpoint, predict
    from t5lite.infer.embedding import BiEncoder
    from t5lite.objectives.finetune import ClassificationObjective
    from t5lite.run_layout import RunDir
    base_dir, _, _, adapter_dir = _seq_cls_adapter(tmp_path, None)
    run = str(tmp_path / "run")
    cli.main(["convert", "--from_hf", base_dir, "--peft_adapter", adapter_dir, "--out", run])
    config, step_dir, record = predict.model_config_of(run, None), checkpoint_reader.step_directory(run), \
        peft_checkpoint.read(run)
    older = {k: v for k, v in record.items() if k != "base_params"}
    for module in (ClassificationObjective(num_labels=LABELS).build_model(config), BiEncoder(config, "mean")):
        abstract = predict.abstract_params(config, None, module)
        jax.tree.map(np.testing.assert_array_equal, peft_checkpoint.restore_merged(step_dir, run, older, abstract),
                     peft_checkpoint.restore_merged(step_dir, run, record, abstract))
    with pytest.raises(peft_checkpoint.CheckpointError, match=rf"^{RunDir(run).peft} predates the base parameter "
                                                                "names.*train the run again$"):
        peft_checkpoint.restore_merged(step_dir, run, {**older, "base_fingerprint": "0" * 16},
                                       predict.abstract_params(config, None, BiEncoder(config, "mean")))
