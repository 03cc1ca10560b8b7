"""Prompt tuning (t5lite.models.peft.PromptTuning) against Hugging Face peft's PromptTuning on the
same weights and the same prompt embeddings: T5's and BART's logits (the prompt on the encoder input; peft with
`num_transformer_submodules=1`, Lester et al.'s setting), BERT's and GPT-2's logits at the input
tokens' positions (peft's outputs also cover the virtual tokens, ours do not), padding masked; the
trained-parameter count equals peft's; the inits take the rows peft's (or Lester's) take."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.errors import ConfigError
from t5lite.models import peft as P

torch = pytest.importorskip("torch", reason="peft parity tests need torch (extras 'hf')")
transformers = pytest.importorskip("transformers", reason="peft parity tests need transformers (extras 'hf')")
peft = pytest.importorskip("peft", reason="peft parity tests need peft (extras 'hf')")

from t5lite.interop import hf  # noqa: E402

V, N = 97, 5
RTOL, ATOL = 1e-4, 1e-5


def _ids(shape, low, seed, pad_last=0):
    ids = np.random.RandomState(seed).randint(low, V, shape)
    ids[1, ids.shape[1] - pad_last:] = 0   # the second row padded (id 0 is every family's pad here)
    return ids


def _t5():
    config = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20)
    enc, dec = _ids((2, 10), 2, 0, pad_last=3), _ids((2, 7), 2, 1)
    return (transformers.T5ForConditionalGeneration(config), "SEQ_2_SEQ_LM",
            dict(input_ids=enc, attention_mask=(enc != 0).astype(np.int64), decoder_input_ids=dec),
            dict(encoder_input_tokens=enc, decoder_input_tokens=dec), 0)


def _bert():
    config = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40)
    ids = _ids((2, 11), 3, 2, pad_last=4)
    return (transformers.BertForMaskedLM(config), "FEATURE_EXTRACTION",
            dict(input_ids=ids, attention_mask=(ids != 0).astype(np.int64)), dict(encoder_input_tokens=ids), N)


def _gpt2():
    config = transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=40, bos_token_id=0,
                                     eos_token_id=0)
    ids = _ids((2, 10), 1, 3)
    return transformers.GPT2LMHeadModel(config), "CAUSAL_LM", dict(input_ids=ids), dict(decoder_input_tokens=ids), N


def _bart():
    config = transformers.BartConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=40, pad_token_id=1)
    enc, dec = _ids((2, 12), 3, 4), _ids((2, 7), 3, 5)
    enc[1, -3:] = 1   # BART's pad id is 1
    return (transformers.BartForConditionalGeneration(config), "SEQ_2_SEQ_LM",
            dict(input_ids=enc, attention_mask=(enc != 1).astype(np.int64), decoder_input_ids=dec),
            dict(encoder_input_tokens=enc, decoder_input_tokens=dec), 0)


FAMILIES = {"t5": _t5, "bert": _bert, "gpt2": _gpt2, "bart": _bart}


def _setup(family, tmp_path):
    torch.manual_seed(0)
    model, task, torch_inputs, features, skip = FAMILIES[family]()
    model.eval().save_pretrained(str(tmp_path / "base"))
    module, variables = hf.load(str(tmp_path / "base"))
    config = peft.PromptTuningConfig(task_type=task, num_virtual_tokens=N, num_transformer_submodules=1)
    return model, config, module, variables["params"], torch_inputs, features, skip


def _apply(module, params, features):
    return np.asarray(jax.jit(module.apply)({"params": params}, **{k: jnp.asarray(v) for k, v in features.items()}))


@pytest.mark.parametrize("family", ["t5", "bert", "gpt2", "bart"])
def test_prompt_tuning_logits_and_count_equal_peft(family, tmp_path):
    model, config, module, base, torch_inputs, features, skip = _setup(family, tmp_path)
    peft_model = peft.get_peft_model(model, config).eval()
    method = P.PromptTuning(num_virtual_tokens=N)
    trained, specs = method.init(jax.random.PRNGKey(0), base, P.logical_specs(module), module.config)
    assert P.count(trained) == peft_model.get_nb_trainable_parameters()[0] == N * 32
    prompt = np.asarray(trained["params"][P.PromptTuning.stack(module.config)]["prompt"])
    with torch.no_grad():
        peft_model.prompt_encoder["default"].embedding.weight.copy_(torch.tensor(prompt))
        ref = peft_model(**{k: torch.tensor(v) for k, v in torch_inputs.items()}).logits.numpy()[:, skip:]
        plain = model(**{k: torch.tensor(v) for k, v in torch_inputs.items()}).logits.numpy()
    ours = _apply(module, method.combine(base, trained), features)
    assert ours.shape == plain.shape and not np.allclose(ref, plain, rtol=RTOL, atol=ATOL)   # the prompt shows
    real = (torch_inputs["input_ids"] != 0)[..., None] if skip else True   # padded positions' logits: unused
    np.testing.assert_allclose(np.where(real, ours, 0), np.where(real, ref, 0), rtol=RTOL, atol=ATOL)
    jax.tree.map(lambda x, s: len(s) == x.ndim or pytest.fail(f"{s} for {x.shape}"), trained, specs,
                 is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
    # peft folders both ways: peft's prompt read by t5lite, t5lite's read by peft.PeftModel.from_pretrained.
    peft_model.save_pretrained(str(tmp_path / "peft_prompt"))
    loaded_method, loaded = hf.load_adapter(str(tmp_path / "peft_prompt"), module)
    assert loaded_method.num_virtual_tokens == N
    jax.tree.map(np.testing.assert_array_equal, loaded, trained)
    _, with_adapter = hf.load(str(tmp_path / "base"), adapter=str(tmp_path / "peft_prompt"))
    np.testing.assert_array_equal(_apply(module, with_adapter["params"], features), ours)
    # ... and by `t5lite convert --from_hf BASE --peft_adapter DIR`, as a prompt-tuning run on the imported base.
    from t5lite.infer import checkpoint_reader, peft_checkpoint, predict
    from t5lite.interop import checkpoint as interop_checkpoint
    run = str(tmp_path / "imported")
    interop_checkpoint.hf_to_t5lite(str(tmp_path / "base"), run, str(tmp_path / "peft_prompt"))
    params = peft_checkpoint.restore_merged(checkpoint_reader.step_directory(run), run, peft_checkpoint.read(run),
                                            predict.abstract_params(module.config))
    np.testing.assert_allclose(_apply(module, params, features), ours, rtol=RTOL, atol=ATOL)
    trained = jax.tree.map(lambda x: x + 0.5, trained)
    out = hf.save_adapter(module, method, trained, str(tmp_path / "ours_prompt"), str(tmp_path / "base"))
    fresh = type(model).from_pretrained(str(tmp_path / "base")).eval()
    theirs = peft.PeftModel.from_pretrained(fresh, out).eval()
    with torch.no_grad():
        ref = theirs(**{k: torch.tensor(v) for k, v in torch_inputs.items()}).logits.numpy()[:, skip:]
    ours = _apply(module, method.combine(base, trained), features)
    np.testing.assert_allclose(np.where(real, ours, 0), np.where(real, ref, 0), rtol=RTOL, atol=ATOL)


def test_prompt_tuning_inits(tmp_path):
    _, _, module, base, _, _, _ = _setup("t5", tmp_path)
    table = np.asarray(base["token_embedder"]["embedding"])
    specs = P.logical_specs(module)

    def prompt(**kw):
        trained, _ = P.PromptTuning(num_virtual_tokens=12, **kw).init(jax.random.PRNGKey(3), base, specs, module.config)
        return np.asarray(trained["params"]["encoder"]["prompt"])

    def rows(x):   # which vocabulary row each prompt vector is
        return [int(np.flatnonzero((table == r).all(1))[0]) for r in x]
    ids = [5, 9, 11, 40, 2]   # peft's TEXT: repeated ceil(12 / 5) times, cut to 12
    assert rows(prompt(prompt_tuning_init="text", init_token_ids=tuple(ids))) == (ids * math.ceil(12 / 5))[:12]
    assert rows(prompt(prompt_tuning_init="text", init_token_ids=tuple(range(20)))) == list(range(12))
    assert all(0 <= r < V for r in rows(prompt(prompt_tuning_init="sample_vocab")))
    assert all(0 <= r < V for r in rows(prompt(prompt_tuning_init="sample_vocab_5000")))   # V < 5000: all rows
    random = prompt()
    assert random.shape == (12, 32) and 0.7 < random.std() < 1.3   # N(0, 1), torch.nn.Embedding's init


def test_prompt_tuning_config_errors():
    with pytest.raises(ConfigError, match="prompt_tuning_init"):
        P.PromptTuning(prompt_tuning_init="vocab")
    with pytest.raises(ConfigError, match="init_token_ids"):
        P.PromptTuning(prompt_tuning_init="text")
    with pytest.raises(ConfigError, match="num_virtual_tokens"):
        P.PromptTuning(num_virtual_tokens=0)


def test_prompt_tuning_trains_decodes_and_refuses_packing(tmp_path, micro_config):
    """A prompt-tuning run on a tiny T5 base: the checkpoint holds only the prompt, which trains;
    inference reads the run as its base plus the prompt and decodes with the KV cache (on a mesh
    too); `convert --to_hf` writes a base and a peft folder giving the same logits, which
    `convert --from_hf --peft_adapter` reads back as a prompt-tuning run; packing and `--merge`
    are refused with the fix."""
    from conftest import train_tiny
    from t5lite.errors import CheckpointError
    from t5lite.infer import checkpoint_reader, peft_checkpoint, predict
    from t5lite.infer.peft_checkpoint import restore_trained
    from t5lite.interop import checkpoint as interop_checkpoint
    from t5lite.models import build
    from t5lite.train.partitioning import Partitioner
    base_dir, run = tmp_path / "base", tmp_path / "prompt"
    train_tiny(base_dir, micro_config, 1)
    method = P.PromptTuning(num_virtual_tokens=3, prompt_tuning_init="text", init_token_ids=(7, 8))
    with pytest.raises(ConfigError, match="train.pack = False"):
        train_tiny(run, micro_config, 2, peft=method, initial_checkpoint_path=str(base_dir))
    train_tiny(run, micro_config, 2, peft=method, initial_checkpoint_path=str(base_dir), pack=False)
    trained = restore_trained(checkpoint_reader.step_directory(str(run / "checkpoints")))
    assert jax.tree.map(np.shape, trained) == {"params": {"encoder": {"prompt": (3, 32)}}}
    params, _, _ = predict.load_params(micro_config, str(run))
    base, _, _ = predict.load_params(micro_config, str(base_dir))
    table = np.asarray(base["token_embedder"]["embedding"])
    assert not np.allclose(np.asarray(params["encoder"]["prompt"]), table[[7, 8, 7]])   # trained from its init
    module = build(micro_config)
    inputs = {"encoder_input_tokens": np.array([[5, 6, 7, 1, 0, 0], [9, 10, 11, 12, 13, 1]])}
    tokens, lengths, _ = predict.Predictor(module, params, max_decode_length=4)(inputs)
    sharded, _, _ = predict.Predictor(module, params, Partitioner((1, 1, 1), devices=jax.devices()[:1]),
                                      max_decode_length=4)(inputs)
    np.testing.assert_array_equal(tokens, sharded)
    # The cached decoding equals the argmax of a teacher-forced forward pass over its own output.
    dec = np.concatenate([np.zeros((2, 1), int), np.asarray(tokens)[:, :-1]], 1)
    logits = module.apply({"params": params}, encoder_input_tokens=jnp.asarray(inputs["encoder_input_tokens"]),
                          decoder_input_tokens=jnp.asarray(dec))
    for row, n in enumerate(lengths):
        np.testing.assert_array_equal(np.argmax(np.asarray(logits[row]), -1)[:n], tokens[row, :n])
    with pytest.raises(CheckpointError, match="does not merge"):
        interop_checkpoint.merge_peft_run(str(run), str(tmp_path / "merged"))
    # `t5lite convert --to_hf RUN` writes DIR/base and DIR/adapter, which peft runs to the same logits.
    from t5lite import cli
    cli.main(["convert", "--to_hf", str(run), "--out", str(tmp_path / "hf")])
    hf_base = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "hf" / "base")).eval()
    theirs = peft.PeftModel.from_pretrained(hf_base, str(tmp_path / "hf" / "adapter")).eval()
    enc = inputs["encoder_input_tokens"]
    with torch.no_grad():
        ref = theirs(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc != 0),
                     decoder_input_ids=torch.tensor(dec)).logits.numpy()
    np.testing.assert_allclose(np.asarray(logits), ref, rtol=RTOL, atol=ATOL)
    # `convert --from_hf B --peft_adapter A` reads the folder back as a prompt-tuning run on the imported base.
    imported = tmp_path / "imported"
    cli.main(["convert", "--from_hf", str(tmp_path / "hf" / "base"), "--peft_adapter", str(tmp_path / "hf" / "adapter"),
              "--out", str(imported)])
    assert peft_checkpoint.read(str(imported))["method"] == "PromptTuning"
    params, _, _ = predict.load_params(micro_config, str(imported))
    logits = module.apply({"params": params}, encoder_input_tokens=jnp.asarray(enc), decoder_input_tokens=jnp.asarray(dec))
    np.testing.assert_allclose(np.asarray(logits), ref, rtol=RTOL, atol=ATOL)


def test_prompt_tuning_decoder_only_refuses_kv_cache(tmp_path):
    _, _, module, base, _, features, _ = _setup("gpt2", tmp_path)
    trained, _ = P.PromptTuning(num_virtual_tokens=N).init(jax.random.PRNGKey(0), base, P.logical_specs(module),
                                                           module.config)
    from t5lite.models import init_cache
    with pytest.raises(ConfigError, match="KV cache"):
        init_cache(module, P.PromptTuning(num_virtual_tokens=N).combine(base, trained), 8, batch_size=2)


@pytest.mark.parametrize("preset,pooling", [("bert_tiny", "first"), ("t5_tiny", "mean"), ("gpt2_tiny", "last")])
def test_prompt_tuning_under_a_task_head(preset, pooling):
    """With a task head the prompt sits in the backbone (params/backbone/<stack>/prompt) and the head
    trains; the head sees the input tokens' states (BERT's "first" is [CLS], not a virtual token)."""
    from t5lite.models import get_config, heads as H
    from t5lite.models.with_head import WithHead
    config = get_config(preset)
    model = WithHead(config, H.SequenceClassificationHead(config, num_labels=3), pooling)
    ids = jnp.asarray(np.random.RandomState(0).randint(3, 90, (2, 6)))
    features = dict(encoder_input_tokens=ids) if config.arch != "decoder" else dict(decoder_input_tokens=ids)
    if config.arch == "encoder_decoder":
        features["decoder_input_tokens"] = ids
    base = nn.unbox(model.init(jax.random.PRNGKey(0), **features))["params"]
    specs = P.logical_specs(model, {k: v.shape[1] for k, v in features.items()})
    method = P.PromptTuning(num_virtual_tokens=4, prompt_tuning_init="sample_vocab")
    trained, _ = method.init(jax.random.PRNGKey(1), base, specs, config)
    assert set(trained["params"]) == {"backbone", "head"}
    assert trained["params"]["backbone"][P.PromptTuning.stack(config)]["prompt"].shape == (4, config.embed_dim)
    with_prompt = model.apply({"params": method.combine(base, trained)}, **features)
    assert with_prompt.shape == (2, 3) and not np.allclose(with_prompt, model.apply({"params": base}, **features))


@pytest.mark.parametrize("family", ["t5", "bert", "gpt2"])
def test_prompt_tuning_explicit_positions_and_segments(family, tmp_path):
    """Given positions 0..l-1 and one segment per row, the prompt's slots take positions 0..n-1 and
    the row's segment: the logits are those of the plain call."""
    _, _, module, base, torch_inputs, features, _ = _setup(family, tmp_path)
    method = P.PromptTuning(num_virtual_tokens=N)
    trained, _ = method.init(jax.random.PRNGKey(0), base, P.logical_specs(module), module.config)
    params = method.combine(base, trained)
    stack = "decoder" if family == "gpt2" else "encoder"
    tokens = features[f"{stack}_input_tokens"]
    extra = {f"{stack}_positions": np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape),
             f"{stack}_segment_ids": (tokens != 0).astype(np.int32) if family != "gpt2" else np.ones_like(tokens)}
    if family == "t5":
        extra["decoder_segment_ids"] = np.ones_like(features["decoder_input_tokens"])
        extra["decoder_positions"] = np.broadcast_to(np.arange(7), (2, 7))
    np.testing.assert_allclose(_apply(module, params, {**features, **extra}), _apply(module, params, features),
                               rtol=RTOL, atol=ATOL)
