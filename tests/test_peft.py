"""LoRA and BitFit (t5lite.models.peft) against Hugging Face peft on the same weights: logits of a
t5lite LoRA equal peft's (adapter copied both ways), trained parameter counts equal
`get_nb_trainable_parameters()`, B = 0 is the base model, merged weights unmerge to the base."""
import functools
import os
import math

import flax

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.errors import ConfigError
from t5lite.models import get_config, build
from t5lite.models import peft as P

torch = pytest.importorskip("torch", reason="peft parity tests need torch (extras 'hf')")
transformers = pytest.importorskip("transformers", reason="peft parity tests need transformers (extras 'hf')")
peft = pytest.importorskip("peft", reason="peft parity tests need peft (extras 'hf')")

from t5lite.interop import hf  # noqa: E402
from conftest import assert_close, nonzero_lora_b  # noqa: E402

V = 97
RTOL, ATOL = 1e-4, 1e-5   # float32 forward passes of different libraries; atol only for logits near 0
# Logits of two libraries compare with conftest.assert_close: a logit near 0 to RTOL of the largest,
# whose rounding it carries (T5's logits of a few units differ from torch's by up to ~1e-5).


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _tokens(shape, low, seed):
    return np.random.RandomState(seed).randint(low, V, shape)


def _t5():
    config = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20)
    enc, dec = _tokens((2, 10), 2, 0), _tokens((2, 7), 2, 1)
    return (transformers.T5ForConditionalGeneration(config),
            dict(input_ids=enc, decoder_input_ids=dec), dict(encoder_input_tokens=enc, decoder_input_tokens=dec))


def _bert():
    config = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40)
    ids = _tokens((2, 11), 3, 2)
    return transformers.BertForMaskedLM(config), dict(input_ids=ids), dict(encoder_input_tokens=ids)


def _gpt2():
    config = transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=40, bos_token_id=0,
                                     eos_token_id=0)
    ids = _tokens((2, 10), 1, 3)
    return transformers.GPT2LMHeadModel(config), dict(input_ids=ids), dict(decoder_input_tokens=ids)


def _bart():
    config = transformers.BartConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=40)
    enc, dec = _tokens((2, 12), 3, 4), _tokens((2, 7), 3, 5)
    return (transformers.BartForConditionalGeneration(config),
            dict(input_ids=enc, decoder_input_ids=dec), dict(encoder_input_tokens=enc, decoder_input_tokens=dec))


def _albert():
    config = transformers.AlbertConfig(vocab_size=V, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, intermediate_size=64, max_position_embeddings=40)
    ids = _tokens((2, 11), 3, 6)
    return transformers.AlbertForMaskedLM(config), dict(input_ids=ids), dict(encoder_input_tokens=ids)


FAMILIES = {"t5": _t5, "bert": _bert, "gpt2": _gpt2, "bart": _bart, "albert": _albert}
EXPLICIT = {"albert": ["query", "value"]}   # peft has no ALBERT default: the targets are named


def _torch_logits(model, inputs):
    with torch.no_grad():
        return model(**{k: torch.tensor(v) for k, v in inputs.items()}).logits.numpy()


def _ours(module, params, features):
    apply = jax.jit(functools.partial(module.apply))
    return np.asarray(apply({"params": params}, **{k: jnp.asarray(v) for k, v in features.items()}))


def _setup(family, tmp_path):
    model, torch_inputs, features = FAMILIES[family]()
    base_dir = str(tmp_path / "base")
    model.eval().save_pretrained(base_dir)
    module, variables = hf.load(base_dir)
    return model, base_dir, module, variables["params"], torch_inputs, features


@pytest.mark.parametrize("family", ["t5", "bert", "gpt2", "bart", "albert"])
def test_lora_logits_equal_peft_both_ways(family, tmp_path):
    model, base_dir, module, base, torch_inputs, features = _setup(family, tmp_path)
    # peft -> t5lite: peft's default targets for the family, non-zero B so the update shows.
    lora_config = peft.LoraConfig(r=4, lora_alpha=8, use_rslora=family == "bert", target_modules=EXPLICIT.get(family))
    peft_model = peft.get_peft_model(model, lora_config).eval()
    nonzero_lora_b(peft_model)
    peft_model.save_pretrained(str(tmp_path / "peft_adapter"))
    ref = _torch_logits(peft_model, torch_inputs)
    with peft_model.disable_adapter():
        assert not np.allclose(ref, _torch_logits(peft_model, torch_inputs), rtol=RTOL, atol=ATOL)
    method, trained = hf.load_adapter(str(tmp_path / "peft_adapter"), module)
    ours = _ours(module, method.combine(base, trained), features)
    assert_close(ours, ref, RTOL)
    _, merged_vars = hf.load(base_dir, adapter=str(tmp_path / "peft_adapter"))
    assert_close(_ours(module, merged_vars["params"], features), ref, RTOL)
    # peft's merged model (merge_and_unload) equals the unmerged one and ours.
    merged_ref = _torch_logits(peft_model.merge_and_unload(), torch_inputs)
    assert_close(ours, merged_ref, RTOL)

    # t5lite -> peft: our init (peft's defaults in t5lite names), a random B, written as a peft folder.
    explicit = EXPLICIT.get(family)
    ours_method = P.LoRA(r=4, lora_alpha=16, target_modules=tuple(explicit) if explicit else None)
    trained, _ = ours_method.init(jax.random.PRNGKey(1), base, P.logical_specs(module), module.config)
    trained = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(2), x.shape), trained)
    out = hf.save_adapter(module, ours_method, trained, str(tmp_path / "ours_adapter"), base_dir)
    fresh = type(model).from_pretrained(base_dir).eval()
    loaded = peft.PeftModel.from_pretrained(fresh, out).eval()
    assert_close(_ours(module, ours_method.combine(base, trained), features), _torch_logits(loaded, torch_inputs),
                 RTOL)


@pytest.mark.parametrize("family,targets", [("t5", None), ("bert", None), ("gpt2", None), ("bart", None),
                                            ("t5", ("query", "key", "value", "out", "wi", "wo"))])
def test_lora_trained_count_equals_peft(family, targets, tmp_path):
    model, _, module, base, _, _ = _setup(family, tmp_path)
    method = P.LoRA(r=8, lora_alpha=8, target_modules=targets)
    trained, specs = method.init(jax.random.PRNGKey(0), base, P.logical_specs(module), module.config)
    hf_targets = {"t5": ["q", "k", "v", "o", "wi", "wo"]}.get(family) if targets else None
    peft_model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=8, target_modules=hf_targets))
    trainable, total = peft_model.get_nb_trainable_parameters()
    assert P.count(trained) == trainable
    buffers = V if family == "bart" else 0   # BART's final_logits_bias is a torch buffer, ours a param
    assert P.count(trained) + P.count(base) - buffers == total
    # Every trained leaf keeps logical axis names for every dimension.
    jax.tree.map(lambda x, s: len(s) == x.ndim or pytest.fail(f"{s} for {x.shape}"), trained, specs,
                 is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))


def test_lora_b_zero_is_base_and_unmerge_restores_it(tmp_path):
    _, _, module, base, _, features = _setup("t5", tmp_path)
    method = P.LoRA(r=4, lora_alpha=8, target_modules=("query", "value", "wo"))
    trained, _ = method.init(jax.random.PRNGKey(0), base, P.logical_specs(module), module.config)
    combined = method.combine(base, trained)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), combined, base)   # B = 0: exactly the base
    trained = jax.tree.map(lambda x: x + jax.random.normal(jax.random.PRNGKey(3), x.shape), trained)
    merged = method.combine(base, trained)
    assert not np.allclose(_ours(module, merged, features), _ours(module, base, features))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 method.unmerge(merged, trained), base)


def _zeros(module):
    tokens = jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), encoder_input_tokens=tokens,
                                                decoder_input_tokens=tokens))
    return jax.tree.map(lambda s: jnp.zeros(s.shape), flax.core.meta.unbox(shapes["params"]))


def test_lora_init_matches_peft_distribution():
    """A ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform_, a = sqrt(5)), B = 0; rsLoRA's scale."""
    config = get_config("t5_tiny", d_model=64, num_heads=2, head_dim=32, d_ff=64, num_encoder_layers=1,
                        num_decoder_layers=1, vocab_size=64)
    module = build(config)
    trained, _ = P.LoRA(r=4).init(jax.random.PRNGKey(0), _zeros(module), P.logical_specs(module), config)
    a = np.asarray(trained["lora"]["encoder"]["layers_0"]["self_attention"]["query"]["lora_a"])
    ref = torch.empty(20000, 64)   # peft's lora_A [r, fan_in] init, sampled widely to find its bound
    torch.nn.init.kaiming_uniform_(ref, a=math.sqrt(5))
    bound = float(ref.abs().max())
    assert a.shape == (64, 4) and np.abs(a).max() <= bound * 1.001 and np.abs(a).max() > 0.8 * bound
    assert not np.any(np.asarray(trained["lora"]["encoder"]["layers_0"]["self_attention"]["query"]["lora_b"]))
    assert P.LoRA(r=4, lora_alpha=8, use_rslora=True).scale == 8 / 2 and P.LoRA(r=4, lora_alpha=8).scale == 2


def test_bitfit_trains_biases_and_refuses_t5(tmp_path):
    _, _, module, base, _, _ = _setup("bert", tmp_path)
    trained, _ = P.BitFit().init(jax.random.PRNGKey(0), base, P.logical_specs(module), module.config)
    from flax.traverse_util import flatten_dict
    names = flatten_dict(trained["params"])
    assert names and all(k[-1].endswith("bias") for k in names)
    ref = sum(p.numel() for n, p in transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "base"))
              .named_parameters() if n.endswith("bias"))
    assert P.count(trained) == ref
    t5 = build(get_config("t5_tiny"))
    with pytest.raises(ConfigError, match="no bias"):
        P.BitFit().init(jax.random.PRNGKey(0), _zeros(t5), P.logical_specs(t5), t5.config)


def test_lora_config_errors():
    with pytest.raises(ConfigError, match="lora_dropout"):
        P.LoRA(lora_dropout=1.0)
    with pytest.raises(ConfigError, match="ALBERT"):
        P.default_targets(get_config("albert_base"))


# ----------------------------------------------------------------------------- training

def test_lora_training_keeps_base_frozen_and_resumes(tmp_path, micro_config):
    """A LoRA run on a tiny T5 base: the state, optimizer state and checkpoint hold only LoRA leaves;
    gradient accumulation works; it resumes; another base is refused with both named."""
    from conftest import train_tiny
    from t5lite.errors import CheckpointError
    from t5lite.infer import checkpoint_reader
    from t5lite.train import trainer as trainer_lib
    base_a, base_b = tmp_path / "base_a", tmp_path / "base_b"
    train_tiny(base_a, micro_config, 1)
    train_tiny(base_b, micro_config, 1, seed=1)
    method = P.LoRA(r=2, lora_alpha=4)
    run = tmp_path / "lora"
    train_tiny(run, micro_config, 3, peft=method, initial_checkpoint_path=str(base_a), num_microbatches=2)
    ckpt = checkpoint_reader.step_directory(str(run / "checkpoints"))
    import orbax.checkpoint as ocp
    stored = ocp.StandardCheckpointer().metadata(os.path.join(ckpt, "state")).item_metadata
    assert set(stored["params"]) == {"params", "lora"} and not stored["params"]["params"]
    lora_leaves = jax.tree.leaves(stored["params"]["lora"])
    trained_size = sum(math.prod(x.shape) for x in lora_leaves)
    assert trained_size == 6 * (32 * 2 + 2 * 32)   # q, v of 3 attentions: A [32, 2], B [2, 1, 2, 16]
    # Adafactor keeps at most one full-size (or factored) accumulator per trained leaf: nothing for the base.
    opt_size = sum(math.prod(x.shape) for x in jax.tree.leaves(stored["opt_state"]))
    assert opt_size <= 2 * trained_size + 16
    # The LoRA B trained away from zero; the base was never written.
    trained = checkpoint_reader.restore_params(str(run / "checkpoints"), jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), stored["params"]))
    assert any(np.any(np.asarray(b)) for b in jax.tree.leaves(trained["lora"]) if b.shape[0] == 2)
    # Evaluation and inference read the run as its base with LoRA merged in.
    from t5lite.infer import predict
    merged, _, _ = predict.load_params(micro_config, str(run))
    base, _, _ = predict.load_params(micro_config, str(base_a))
    expected = method.combine(base, trained)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6), merged, expected)
    assert not np.allclose(merged["encoder"]["layers_0"]["self_attention"]["query"]["kernel"],
                           base["encoder"]["layers_0"]["self_attention"]["query"]["kernel"])
    train_tiny(run, micro_config, 5, peft=method, initial_checkpoint_path=str(base_a), num_microbatches=2)
    assert checkpoint_reader.step_directory(str(run / "checkpoints")).endswith("5")
    with pytest.raises(CheckpointError, match="base_a.*base_b"):
        train_tiny(run, micro_config, 7, peft=method, initial_checkpoint_path=str(base_b))
    assert trainer_lib.peft_lib.LoRA is P.LoRA
    os.rename(base_a, tmp_path / "moved")
    with pytest.raises(CheckpointError, match="PEFT run.*base_a/checkpoints/1, which is gone"):
        predict.load_params(micro_config, str(run))
    os.rename(tmp_path / "moved", base_a)

    _sharded("infer", str(run))   # read for inference over a (1, 2, 2) mesh: the same merged params
    # `t5lite convert --merge` writes a plain checkpoint; `--to_hf` writes base + a peft adapter that
    # peft loads onto the base with the same logits.
    from t5lite import cli
    cli.main(["convert", "--merge", str(run), "--out", str(tmp_path / "merged")])
    merged5, _, _ = predict.load_params(micro_config, str(run))
    full = checkpoint_reader.restore_params(str(tmp_path / "merged"), jax.tree.map(np.asarray, merged5))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), full, merged5)
    cli.main(["convert", "--to_hf", str(run), "--out", str(tmp_path / "hf")])
    model = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "hf" / "base")).eval()
    loaded = peft.PeftModel.from_pretrained(model, str(tmp_path / "hf" / "adapter")).eval()
    enc, dec = _tokens((2, 10), 2, 0), _tokens((2, 7), 2, 1)
    ref = _torch_logits(loaded, dict(input_ids=enc, decoder_input_ids=dec))
    ours = _ours(build(micro_config), merged5, dict(encoder_input_tokens=enc, decoder_input_tokens=dec))
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


def test_lora_with_task_head_counts_like_peft_seq_cls(tmp_path):
    """The head trains too (peft's modules_to_save for SEQ_CLS: the classifier)."""
    from t5lite.objectives.finetune import ClassificationObjective
    config = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40, num_labels=3)
    model = transformers.BertForSequenceClassification(config)
    model.bert.save_pretrained(str(tmp_path))
    backbone, variables = hf.load(str(tmp_path))
    module = ClassificationObjective(num_labels=3).build_model(backbone.config)
    specs = P.logical_specs(module, {"encoder_input_tokens": 4, "token_type_ids": 4})
    params = {"backbone": variables["params"], "head": _zeros_of(module)["head"]}
    trained, _ = P.LoRA().init(jax.random.PRNGKey(0), params, specs, backbone.config)
    assert set(trained["params"]) == {"head"}
    peft_model = peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS"))
    assert P.count(trained) == peft_model.get_nb_trainable_parameters()[0]


def _zeros_of(module):
    tokens = jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), encoder_input_tokens=tokens,
                                                token_type_ids=tokens))
    return jax.tree.map(lambda s: jnp.zeros(s.shape), flax.core.meta.unbox(shapes["params"]))


def test_gin_files_bind_the_methods():
    import gin
    from conftest import REPO
    from t5lite.train import trainer  # noqa: F401  registers LoRA and BitFit
    for name, cls in (("lora", P.LoRA), ("bitfit", P.BitFit), ("prompt_tuning", P.PromptTuning)):
        gin.clear_config()
        gin.parse_config_file(str(REPO / "gin" / "peft" / f"{name}.gin"))
        assert isinstance(gin.query_parameter("train.peft").scoped_configurable_fn(), cls)
    gin.clear_config()


def test_lora_unmerged_training_forward_equals_merged_and_drops_out(tmp_path):
    """The train step's unmerged LoRA (W x + s B A dropout(x)) equals the merged weights without
    dropout, for looped and scanned stacks; lora_dropout changes the output in training only."""
    _, _, module, base, _, features = _setup("gpt2", tmp_path)
    module = build(module.config.replace(dropout_rate=0.0))   # only LoRA's own dropout remains
    features = {k: jnp.asarray(v) for k, v in features.items()}
    training = dict(enable_dropout=True, rngs={"dropout": jax.random.PRNGKey(0)})
    for rate in (0.0, 0.5):
        method = P.LoRA(r=4, lora_alpha=8, lora_dropout=rate, target_modules=(("query", "key", "value"), "wo"))
        trained, _ = method.init(jax.random.PRNGKey(0), base, P.logical_specs(module), module.config)
        trained = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(1), x.shape), trained)
        merged = _ours(module, method.combine(base, trained), features)
        params, context = method.for_training(base, trained)
        with context:
            unmerged = np.asarray(module.apply({"params": params}, **features))
            dropped = np.asarray(module.apply({"params": params}, **features, **training))
        np.testing.assert_allclose(unmerged, merged, rtol=RTOL, atol=ATOL)
        assert np.allclose(dropped, merged, rtol=RTOL, atol=ATOL) == (rate == 0.0)
    scanned = build(module.config.replace(scan_layers=True))
    from t5lite.models import scan_params
    method = P.LoRA(r=4, lora_alpha=8)
    s_base = scan_params(base)
    trained, _ = method.init(jax.random.PRNGKey(0), s_base, P.logical_specs(scanned), scanned.config)
    trained = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(1), x.shape), trained)
    params, context = method.for_training(s_base, trained)
    with context:
        unmerged = np.asarray(scanned.apply({"params": params}, **features))
    np.testing.assert_allclose(unmerged, _ours(scanned, method.combine(s_base, trained), features),
                               rtol=RTOL, atol=ATOL)


def test_bitfit_train_steps_update_only_biases_and_head(tmp_path):
    """BitFit on a BERT classifier through TrainTask: AdamW's state is two moments per trained
    leaf (nothing for the frozen base), the base stays bit-identical, biases and the head move,
    and 2 accumulated microbatches give the gradient of the whole batch."""
    import optax
    from flax.traverse_util import flatten_dict
    from t5lite.objectives.finetune import ClassificationObjective
    from t5lite.train.partitioning import Partitioner
    from t5lite.train.step import TrainTask
    _, _, backbone, base, _, _ = _setup("bert", tmp_path)
    config = backbone.config.replace(dropout_rate=0.0, encoder_head="none")
    base = {k: v for k, v in base.items() if k != "mlm_head"}
    lengths = {"encoder_input_tokens": 8, "token_type_ids": 8, "label": 1}
    rng = np.random.RandomState(0)
    batch = {"encoder_input_tokens": jnp.asarray(rng.randint(3, V, (4, 8)), jnp.int32),
             "token_type_ids": jnp.zeros((4, 8), jnp.int32), "label": jnp.asarray([[0], [1], [1], [0]], jnp.int32)}
    states = {}
    # Adam's eps far above float rounding: the attention key bias has no true gradient (softmax is
    # shift-invariant), and with eps 1e-8 Adam would scale its rounding noise up to steps of size lr.
    adam = optax.adam(1e-2, eps=1e-4)
    for microbatches in (1, 2):
        task = TrainTask(config, adam, optax.constant_schedule(1e-2), Partitioner(), lengths,
                         num_microbatches=microbatches, objective=ClassificationObjective(pooling="first"),
                         peft=P.BitFit())
        frozen = task.init_base(0, {"backbone": base, "head": None})
        before = jax.tree.map(np.asarray, frozen)
        state = task.init_state(0, frozen)
        trained_leaves = jax.tree.leaves(state.params)
        assert P.count(state.params) == task.num_params < P.count(frozen) // 10
        adam_moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim]
        assert sum(x.size for x in adam_moments) == 2 * task.num_params
        step = task.jit_train_step(frozen)
        start = jax.tree.map(np.asarray, state.params)
        for _ in range(3):
            state, metrics = step(state, batch)
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), frozen, before)
        moved = flatten_dict(jax.tree.map(lambda a, b: not np.array_equal(np.asarray(a), b), state.params, start))
        assert all(moved.values()) and len(moved) == len(trained_leaves)
        assert {k[0] for k in moved} == {"params"} and any(k[1] == "head" for k in moved)
        states[microbatches] = state.params
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), states[1], states[2])


def _sharded(*args):
    """tests/peft_sharding_worker.py in a subprocess (the device count is fixed when JAX starts)."""
    import subprocess
    import sys
    from conftest import REPO
    out = subprocess.run([sys.executable, str(REPO / "tests" / "peft_sharding_worker.py"), *args],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-2000:] + out.stderr[-3000:]


def test_lora_shards_like_the_rest():
    """A scanned T5 with LoRA on q, v, wi, wo over a (1, 2, 2) mesh with 2 microbatches trains to the
    same LoRA params as one device."""
    _sharded("train")


def test_base_fingerprint_sees_one_ulp_and_a_permutation():
    """(Its independence of the mesh is shown by the sharded `infer` worker, which checks it.)"""
    from t5lite.infer.peft_checkpoint import fingerprint
    x = jnp.arange(12.0).reshape(3, 4)
    base = fingerprint({"x": x, "head": None})
    assert base == fingerprint({"x": x})
    assert base != fingerprint({"x": x.at[1, 2].set(np.nextafter(np.float32(6), np.float32(7)))})
    assert base != fingerprint({"x": x[::-1]}) and base != fingerprint({"x": x.reshape(4, 3)})


@pytest.mark.parametrize("config,cls", [("minilm_lora_sst2", P.LoRA), ("minilm_bitfit_sst2", P.BitFit)])
def test_minilm_peft_configs_parse(config, cls):
    import gin
    from conftest import REPO
    from t5lite import cli
    from t5lite.train import trainer
    gin.clear_config()
    try:
        cli.parse_gin([str(REPO / "configs" / "local" / f"{config}.gin")],
                      ["MODEL_DIR = '/tmp/x'", "INITIAL_CHECKPOINT_PATH = '/tmp/base'", "VOCABULARY = '/tmp/v.txt'", "DATA_DIR = 'data'"],
                      entry=("train", trainer.train))
        assert isinstance(gin.query_parameter("train.peft").scoped_configurable_fn(), cls)
        assert gin.query_parameter("warmup_cosine.peak_learning_rate") > 1e-4
    finally:
        gin.clear_config()
