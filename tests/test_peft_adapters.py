"""Bottleneck adapters (t5lite.models.peft.Adapters, t5lite.models.bottleneck) against the
`adapters` package (1.3) on the same weights: logits of Houlsby ("double_seq_bn") and Pfeiffer
("seq_bn") adapters on BERT, GPT-2, BART and T5 equal adapters' forward, and the trained parameter
counts equal adapters' after `train_adapter`. Without `adapters` installed: an identity-initialised
adapter is the base model, scanned layers equal looped ones, and training keeps the base frozen
with optimizer state for the adapters only."""
import math
import re

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite.errors import ConfigError
from t5lite.models import build, scan_params
from t5lite.models import peft as P

torch = pytest.importorskip("torch", reason="adapter parity tests need torch (extras 'hf')")
transformers = pytest.importorskip("transformers", reason="adapter parity tests need transformers (extras 'hf')")

from t5lite.interop import hf  # noqa: E402

V = 97
RTOL, ATOL = 1e-4, 1e-5   # float32 forward passes of different libraries; atol only for logits near 0
ADAPTERS_REASON = "the adapters package (1.3, which pins transformers 4.57.x: extras 'test') is the reference"


def _tokens(shape, low, seed):
    return np.random.RandomState(seed).randint(low, V, shape)


def _bert():
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=40))


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4,
                                                                n_positions=40))


def _bart():
    return transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=40))


def _t5():
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=20))


FAMILIES = {"bert": _bert, "gpt2": _gpt2, "bart": _bart, "t5": _t5}


def _inputs(family):
    """(torch inputs, t5lite features) of two rows."""
    enc, dec = _tokens((2, 10), 3, 1), _tokens((2, 7), 3, 2)
    if family in ("bart", "t5"):
        return dict(input_ids=enc, decoder_input_ids=dec), dict(encoder_input_tokens=enc, decoder_input_tokens=dec)
    return dict(input_ids=enc), {"decoder_input_tokens" if family == "gpt2" else "encoder_input_tokens": enc}


def _setup(family, tmp_path):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    model.save_pretrained(str(tmp_path / "base"))
    module, variables = hf.load(str(tmp_path / "base"))
    return model, module, variables["params"]


def _ours(module, params, features):
    return np.asarray(jax.jit(module.apply)({"params": params}, **{k: jnp.asarray(v) for k, v in features.items()}))


def _t5lite_path(family: str, name: str, config: str) -> tuple[str, ...]:
    """Where an adapters weight (e.g. bert.encoder.layer.1.output.adapters.a.adapter_up.weight)
    lives in t5lite's params: (stack, layers_i, config, sublayer, down|up, kernel|bias)."""
    decoder = family == "gpt2" or re.search(r"(^|\.)decoder\.", name) is not None
    layer = int(re.search(r"\.(?:layer|layers|h|block)\.(\d+)\.", name).group(1))
    if family == "t5":   # block.i.layer.j: self-attention, (decoder: cross-attention,) MLP
        j = int(re.search(r"\.layer\.(\d+)\.adapters\.", name).group(1))
        sublayer = (["self_attention", "cross_attention", "mlp"] if decoder else ["self_attention", "mlp"])[j]
    elif "cross_attention_adapters" in name:
        sublayer = "cross_attention"
    elif "attention" in name:   # BERT attention.output, GPT-2 / BART attention_adapters
        sublayer = "self_attention"
    else:   # BERT output, GPT-2 / BART output_adapters
        sublayer = "mlp"
    return ("decoder" if decoder else "encoder", f"layers_{layer}", config, sublayer,
            "down" if ".adapter_down." in name else "up", "kernel" if name.endswith("weight") else "bias")


def _adapters_weights(model, family: str, config: str) -> dict:
    """adapters' adapter weights as a t5lite trained tree (torch [out, in] kernels transposed)."""
    flat = {}
    for name, p in model.named_parameters():
        if ".adapters.a." in name:
            value = p.detach().numpy()
            flat[_t5lite_path(family, name, config)] = value.T if value.ndim == 2 else value
    return {"params": unflatten_dict(flat)}


CASES = [(f, c) for f in FAMILIES for c in ("houlsby", "pfeiffer")] + [("bart", "houlsby-cross")]


@pytest.mark.parametrize("family,config", CASES)
def test_adapters_logits_and_counts_equal_the_adapters_package(family, config, tmp_path):
    adapters = pytest.importorskip("adapters", reason=ADAPTERS_REASON)
    model, module, base = _setup(family, tmp_path)
    torch_inputs, features = _inputs(family)
    cross = config.endswith("-cross")
    config = config.removesuffix("-cross")
    reference_config = {"houlsby": adapters.DoubleSeqBnConfig, "pfeiffer": adapters.SeqBnConfig}[config]
    adapters.init(model)
    model.add_adapter("a", config=reference_config(cross_adapter=cross))
    model.train_adapter("a")
    model.eval()
    with torch.no_grad():   # a visible update: adapters' own init is near the identity
        for name, p in model.named_parameters():
            if ".adapters.a." in name:
                p.normal_(0, 0.3)
    with torch.no_grad():
        ref = model(**{k: torch.tensor(v) for k, v in torch_inputs.items()}).logits.numpy()
    method = P.Adapters(config=config, cross_adapter=cross)
    trained, specs = method.init(jax.random.PRNGKey(0), base, P.logical_specs(module), module.config)
    # Same places and shapes as adapters' (which, for the MLM/LM heads here, freezes the whole base model).
    theirs = _adapters_weights(model, family, config)
    assert jax.tree.map(np.shape, trained) == jax.tree.map(np.shape, theirs)
    assert P.count(trained) == sum(p.numel() for p in model.base_model.parameters() if p.requires_grad)
    assert set(flatten_dict(specs)) == set(flatten_dict(trained))
    ours = _ours(module, method.combine(base, theirs), features)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)
    assert not np.allclose(_ours(module, base, features), ref, rtol=RTOL, atol=ATOL)


def test_identity_adapters_are_the_base_and_scanned_equals_looped(tmp_path):
    """mam_adapter's init (up projection zero) leaves every layer's output as it was; a scanned
    stack applies the same adapters as the looped one (BART: post-norm encoder and decoder)."""
    _, module, base = _setup("bart", tmp_path)
    _, features = _inputs("bart")
    specs = P.logical_specs(module)
    identity = P.Adapters(config="pfeiffer", init_weights="mam_adapter", cross_adapter=True)
    trained, _ = identity.init(jax.random.PRNGKey(0), base, specs, module.config)
    np.testing.assert_array_equal(_ours(module, identity.combine(base, trained), features),
                                  _ours(module, base, features))
    method = P.Adapters(config="houlsby")
    trained, _ = method.init(jax.random.PRNGKey(0), base, specs, module.config)
    trained = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(1), x.shape), trained)
    looped = _ours(module, method.combine(base, trained), features)
    assert not np.allclose(looped, _ours(module, base, features), rtol=RTOL, atol=ATOL)
    scanned = build(module.config.replace(scan_layers=True))
    s_base = scan_params(base)
    s_trained, s_specs = method.init(jax.random.PRNGKey(0), s_base, P.logical_specs(scanned), scanned.config)
    assert all(tuple(s)[0] == "layers" for p, s in flatten_dict(s_specs["params"]).items() if "houlsby" in p)
    s_trained = {"params": scan_params(trained["params"])}
    np.testing.assert_allclose(_ours(scanned, method.combine(s_base, s_trained), features), looped,
                               rtol=RTOL, atol=ATOL)


def test_adapter_inits_follow_the_adapters_package():
    """"bert": N(0, 0.02) kernels; "houlsby": N(0, 0.01) truncated at +-0.02; "mam_adapter": down
    U(+-1/sqrt(d_model)), up 0; biases 0; a bottleneck of int(d_model // reduction_factor) units."""
    from t5lite.models import get_config
    config = get_config("minilm_l6_h384")
    module = build(config)
    abstract = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), encoder_input_tokens=jnp.ones((1, 4), jnp.int32)))
    base = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), flax.linen.unbox(abstract))["params"]
    specs = P.logical_specs(module, {"encoder_input_tokens": 4})
    for init, check in (("bert", lambda down, up: (np.std(down), np.std(up))),
                        ("houlsby", lambda down, up: (np.abs(down).max(), np.abs(up).max()))):
        trained, _ = P.Adapters(init_weights=init).init(jax.random.PRNGKey(0), base, specs, config)
        flat = flatten_dict(trained["params"])
        down = np.concatenate([np.ravel(v) for k, v in flat.items() if k[-2:] == ("down", "kernel")])
        up = np.concatenate([np.ravel(v) for k, v in flat.items() if k[-2:] == ("up", "kernel")])
        assert all(not np.any(v) for k, v in flat.items() if k[-1] == "bias")
        assert {v.shape for k, v in flat.items() if k[-2:] == ("down", "kernel")} == {(384, 24)}
        if init == "bert":
            np.testing.assert_allclose(check(down, up), (0.02, 0.02), rtol=0.05)
        else:
            assert max(check(down, up)) <= 0.02 and np.std(down) > 0.007
    trained, _ = P.Adapters(config="pfeiffer", init_weights="mam_adapter", reduction_factor=6).init(
        jax.random.PRNGKey(0), base, specs, config)
    flat = flatten_dict(trained["params"])
    assert {k[-3] for k in flat} == {"mlp"} and len(flat) == 4 * config.num_encoder_layers
    down = np.concatenate([np.ravel(v) for k, v in flat.items() if k[-2:] == ("down", "kernel")])
    assert down.size == config.num_encoder_layers * 384 * 64
    assert np.abs(down).max() <= 1 / math.sqrt(384) and np.abs(down).max() > 0.9 / math.sqrt(384)
    assert not any(np.any(v) for k, v in flat.items() if k[-2:] == ("up", "kernel"))


def test_adapters_training_keeps_the_base_frozen(tmp_path):
    """Houlsby adapters on a BERT classifier through TrainTask: AdamW's state is two moments per
    adapter or head leaf, the base stays bit-identical, every adapter leaf and the head move."""
    import optax
    from t5lite.objectives.finetune import ClassificationObjective
    from t5lite.train.partitioning import Partitioner
    from t5lite.train.step import TrainTask
    _, backbone, base = _setup("bert", tmp_path)
    config = backbone.config.replace(dropout_rate=0.0, encoder_head="none")
    base = {k: v for k, v in base.items() if k != "mlm_head"}
    lengths = {"encoder_input_tokens": 8, "token_type_ids": 8, "label": 1}
    rng = np.random.RandomState(0)
    batch = {"encoder_input_tokens": jnp.asarray(rng.randint(3, V, (4, 8)), jnp.int32),
             "token_type_ids": jnp.zeros((4, 8), jnp.int32), "label": jnp.asarray([[0], [1], [1], [0]], jnp.int32)}
    task = TrainTask(config, optax.adam(1e-2), optax.constant_schedule(1e-2), Partitioner(), lengths,
                     objective=ClassificationObjective(pooling="first"), peft=P.Adapters())
    frozen = task.init_base(0, {"backbone": base, "head": None})
    before = jax.tree.map(np.asarray, frozen)
    state = task.init_state(0, frozen)
    assert task.num_params == P.count(state.params) < P.count(frozen) // 10
    assert sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim) == 2 * task.num_params
    step = task.jit_train_step(frozen)
    start = jax.tree.map(np.asarray, state.params)
    for _ in range(3):
        state, _ = step(state, batch)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), frozen, before)
    moved = flatten_dict(jax.tree.map(lambda a, b: not np.array_equal(np.asarray(a), b), state.params, start))
    assert all(moved.values())
    assert {k[1] for k in moved} == {"backbone", "head"} and sum("houlsby" in k for k in moved) == 2 * 2 * 4


def test_adapters_config_errors_and_gin():
    import gin
    from conftest import REPO
    from t5lite.train import trainer   # registers Adapters
    for bad in (dict(config="parallel"), dict(init_weights="lora"), dict(reduction_factor=0)):
        with pytest.raises(ConfigError, match="Adapters"):
            P.Adapters(**bad)
    for name in ("houlsby", "pfeiffer"):
        gin.clear_config()
        try:
            gin.parse_config_file(str(REPO / "gin" / "peft" / f"{name}.gin"))
            method = gin.query_parameter("train.peft").scoped_configurable_fn()
            assert isinstance(method, P.Adapters) and method.config == name
        finally:
            gin.clear_config()
    from t5lite import cli
    try:   # the MiniLM SST-2 config as `t5lite train` reads it
        cli.parse_gin([str(REPO / "configs" / "local" / "minilm_houlsby_sst2.gin")],
                      ["MODEL_DIR = '/tmp/x'", "INITIAL_CHECKPOINT_PATH = '/tmp/base'", "DATA_DIR = 'data'"],
                      entry=("train", trainer.train))
        assert gin.query_parameter("train.peft").scoped_configurable_fn() == P.Adapters(config="houlsby")
        assert gin.query_parameter("warmup_cosine.peak_learning_rate") == 1e-3
    finally:
        gin.clear_config()


def test_adapters_run_trains_decodes_and_refuses_merging(tmp_path, micro_config):
    """A Houlsby run on a tiny T5 base (Adafactor, packed): the checkpoint holds only the adapters,
    which train; inference reads the run as its base plus the adapters and decodes with the KV
    cache as a teacher-forced pass does; `convert --merge` and `--to_hf` are refused with the fix."""
    from conftest import train_tiny
    from t5lite.errors import CheckpointError
    from t5lite.infer import checkpoint_reader, predict
    from t5lite.infer.peft_checkpoint import restore_trained
    from t5lite.interop import checkpoint as interop_checkpoint
    base_dir, run = tmp_path / "base", tmp_path / "adapters"
    train_tiny(base_dir, micro_config, 1)
    method = P.Adapters(config="houlsby", reduction_factor=8, cross_adapter=True)
    train_tiny(run, micro_config, 2, peft=method, initial_checkpoint_path=str(base_dir))
    trained = restore_trained(checkpoint_reader.step_directory(str(run / "checkpoints")))
    shapes = {(k[0], k[3], k[4], k[5]): v for k, v in flatten_dict(jax.tree.map(np.shape, trained["params"])).items()}
    assert set(flatten_dict(trained)) == {("params", *k) for k in flatten_dict(trained["params"])}
    assert shapes[("encoder", "self_attention", "down", "kernel")] == (32, 4)
    assert {k[:2] for k in shapes} == {("encoder", "self_attention"), ("encoder", "mlp"), ("decoder", "self_attention"),
                                       ("decoder", "cross_attention"), ("decoder", "mlp")}
    params, _, _ = predict.load_params(micro_config, str(run))
    base, _, _ = predict.load_params(micro_config, str(base_dir))
    assert P.count(params) == P.count(base) + P.count(trained)
    module = build(micro_config)
    inputs = {"encoder_input_tokens": np.array([[5, 6, 7, 1, 0, 0], [9, 10, 11, 12, 13, 1]])}
    tokens, lengths, _ = predict.Predictor(module, params, max_decode_length=4)(inputs)
    dec = np.concatenate([np.zeros((2, 1), int), np.asarray(tokens)[:, :-1]], 1)
    features = dict(encoder_input_tokens=inputs["encoder_input_tokens"], decoder_input_tokens=dec)
    logits = _ours(module, params, features)
    assert not np.allclose(logits, _ours(module, base, features), rtol=RTOL, atol=ATOL)
    for row, n in enumerate(lengths):
        np.testing.assert_array_equal(np.argmax(logits[row], -1)[:n], tokens[row, :n])
    with pytest.raises(CheckpointError, match="does not merge"):
        interop_checkpoint.merge_peft_run(str(run), str(tmp_path / "merged"))
    with pytest.raises(hf.HFConversionError, match="evaluate and infer with the run itself"):
        interop_checkpoint.t5lite_to_hf(str(run), str(tmp_path / "hf"))
