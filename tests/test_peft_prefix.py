"""Prefix tuning (t5lite.models.peft.PrefixTuning) against Hugging Face peft's PrefixTuning on the
same weights and the same prefix encoder: T5's, BART's, GPT-2's and BERT's logits, with and without
`prefix_projection`, padding masked; peft adapter folders both ways; the trained-parameter count
equals peft's `get_nb_trainable_parameters`; KV-cache decoding gives the tokens of the full
forward pass; training leaves the base bit-identical."""
import inspect
import os

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

V, N = 97, 4
RTOL, ATOL = 1e-4, 1e-5


def _ids(shape, low, seed):
    return np.random.RandomState(seed).randint(low, V, shape)


def _t5():
    config = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_decoder_layers=3,
                                   num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
                                   decoder_start_token_id=0)
    enc, dec = _ids((2, 9), 2, 0), _ids((2, 7), 2, 1)
    enc[1, -3:] = 0
    dec[:, 0] = 0
    mask = (enc != 0).astype(np.int64)
    return (transformers.T5ForConditionalGeneration(config), "SEQ_2_SEQ_LM",
            dict(input_ids=enc, attention_mask=mask, decoder_input_ids=dec),
            dict(encoder_input_tokens=enc, decoder_input_tokens=dec))


def _gpt2():
    config = transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=3, n_head=4, n_positions=40, bos_token_id=0,
                                     eos_token_id=0)
    ids = _ids((2, 10), 1, 3)
    return (transformers.GPT2LMHeadModel(config), "CAUSAL_LM", dict(input_ids=ids, attention_mask=np.ones_like(ids)),
            dict(decoder_input_tokens=ids))


def _bert():
    config = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40)
    ids = _ids((2, 11), 3, 2)
    ids[1, -4:] = 0
    return (transformers.BertForMaskedLM(config), "FEATURE_EXTRACTION",
            dict(input_ids=ids, attention_mask=(ids != 0).astype(np.int64)), dict(encoder_input_tokens=ids))


def _bart():
    config = transformers.BartConfig(vocab_size=V, d_model=32, encoder_layers=3, decoder_layers=3,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=40, pad_token_id=1)
    enc, dec = _ids((2, 12), 3, 4), _ids((2, 7), 3, 5)
    enc[1, -3:] = 1   # BART's pad id is 1
    return (transformers.BartForConditionalGeneration(config), "SEQ_2_SEQ_LM",
            dict(input_ids=enc, attention_mask=(enc != 1).astype(np.int64), decoder_input_ids=dec),
            dict(encoder_input_tokens=enc, decoder_input_tokens=dec))


FAMILIES = {"t5": _t5, "gpt2": _gpt2, "bert": _bert, "bart": _bart}


def _setup(family, tmp_path, **overrides):
    torch.manual_seed(0)
    model, task, torch_inputs, features = FAMILIES[family]()
    model.eval().save_pretrained(str(tmp_path / "base"))
    module, variables = hf.load(str(tmp_path / "base"), **overrides)
    return model, task, module, variables["params"], torch_inputs, features


def _apply(module, params, features):
    return np.asarray(jax.jit(module.apply)({"params": params}, **{k: jnp.asarray(v) for k, v in features.items()}))


def _torch(model, inputs):
    with torch.no_grad():
        return model(**{k: torch.tensor(v) for k, v in inputs.items()}).logits.numpy()


def _peft_base(model):
    """What peft wraps: BERT's encoder alone, as peft's FEATURE_EXTRACTION task expects (AutoModel;
    transformers 4.x's BertForMaskedLM takes no past_key_values), the other families whole."""
    return model.bert if isinstance(model, transformers.BertForMaskedLM) else model


def _peft_logits(model, wrapped, inputs):
    """The logits of `wrapped`, a peft model around `_peft_base(model)`: BERT's through `model`'s MLM head."""
    if not isinstance(model, transformers.BertForMaskedLM):
        return _torch(wrapped, inputs)
    with torch.no_grad():
        return model.cls(wrapped(**{k: torch.tensor(v) for k, v in inputs.items()}).last_hidden_state).numpy()


def _to_peft_encoder(prefix, encoder):
    """t5lite's prefix encoder tree -> peft's PrefixEncoder weights (Linear weights are [out, in]),
    leaf for leaf and shape for shape."""
    ours = {"embedding.weight": prefix["embedding"]}
    for i in (0, 2):
        if f"transform_{i}" in prefix:
            ours[f"transform.{i}.weight"] = np.asarray(prefix[f"transform_{i}"]["kernel"]).T
            ours[f"transform.{i}.bias"] = prefix[f"transform_{i}"]["bias"]
    state = encoder.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == {k: np.shape(v) for k, v in ours.items()}
    encoder.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in ours.items()})


@pytest.mark.parametrize("projection", [False, True], ids=["embedding", "projection"])
@pytest.mark.parametrize("family", ["t5", "gpt2", "bert", "bart"])
def test_prefix_tuning_logits_and_count_equal_peft_both_ways(family, projection, tmp_path):
    model, task, module, base, torch_inputs, features = _setup(family, tmp_path)
    real = (torch_inputs["input_ids"] != 0)[..., None] if family == "bert" else True   # padding's logits: unused
    plain = np.where(real, _torch(model, torch_inputs), 0)
    config = peft.PrefixTuningConfig(task_type=task, num_virtual_tokens=N, prefix_projection=projection,
                                     encoder_hidden_size=24 if projection else None)
    peft_model = peft.get_peft_model(_peft_base(model), config).eval()
    method = P.PrefixTuning(num_virtual_tokens=N, prefix_projection=projection,
                            encoder_hidden_size=24 if projection else None)
    trained, specs = method.init(jax.random.PRNGKey(0), base, P.logical_specs(module), module.config)
    assert P.count(trained) == peft_model.get_nb_trainable_parameters()[0]
    assert trained["params"] == {}
    jax.tree.map(lambda x, s: len(s) == x.ndim or pytest.fail(f"{s} for {x.shape}"), trained, specs,
                 is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
    _to_peft_encoder(trained["prefix"], peft_model.prompt_encoder["default"])
    ref = np.where(real, _peft_logits(model, peft_model, torch_inputs), 0)
    ours = np.where(real, _apply(module, method.combine(base, trained), features), 0)
    assert not np.allclose(ref, plain, rtol=RTOL, atol=ATOL)   # the prefix shows
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)
    # Scanned layers take the same prefixes, stacked.
    scanned_module, scanned = hf.load(str(tmp_path / "base"), scan_layers=True)
    np.testing.assert_allclose(np.where(real, _apply(scanned_module, method.combine(scanned["params"], trained),
                                                     features), 0), ref, rtol=RTOL, atol=ATOL)
    # peft's folder read by t5lite (peft saves the prefix encoder's output: the projection applied).
    peft_model.save_pretrained(str(tmp_path / "peft_prefix"))
    loaded_method, loaded = hf.load_adapter(str(tmp_path / "peft_prefix"), module)
    assert loaded_method == P.PrefixTuning(num_virtual_tokens=N)
    np.testing.assert_allclose(np.where(real, _apply(module, loaded_method.combine(base, loaded), features), 0), ref,
                               rtol=RTOL, atol=ATOL)
    _, with_adapter = hf.load(str(tmp_path / "base"), adapter=str(tmp_path / "peft_prefix"))
    np.testing.assert_allclose(np.where(real, _apply(module, with_adapter["params"], features), 0), ref,
                               rtol=RTOL, atol=ATOL)
    # t5lite's folder read by peft.PeftModel.from_pretrained.
    trained = jax.tree.map(lambda x: x * 0.5 + 0.1, trained)
    out = hf.save_adapter(module, method, trained, str(tmp_path / "ours_prefix"), str(tmp_path / "base"))
    fresh = type(model).from_pretrained(str(tmp_path / "base")).eval()
    theirs = peft.PeftModel.from_pretrained(_peft_base(fresh), out).eval()
    np.testing.assert_allclose(np.where(real, _apply(module, method.combine(base, trained), features), 0),
                               np.where(real, _peft_logits(fresh, theirs, torch_inputs), 0), rtol=RTOL, atol=ATOL)


def _li_liang_past_key_values(trained, layers, heads, head_dim):
    """Li and Liang's prefixes, transcribed from their code (XiangLi1999/PrefixTuning,
    seq2seq/prefixTuning.py, PrefixTuning.get_prompt_p5, batch of 1): each of the three prefix
    encoders (control_trans for the decoder's self-attention, control_trans2 for its
    cross-attention, control_trans_enc for the encoder) emits [bsz, seqlen, match_n_layer * 2 *
    n_embd], which is `.view(bsz, seqlen, match_n_layer * 2, match_n_head, match_n_embd)
    .permute([2, 0, 3, 1, 4]).split(2)`; layer i reads key_val[0], key_val[1] of split i, as
    {'self', 'encoder_decoder', 'encoder'}: {'prev_key', 'prev_value'} [bsz, heads, seqlen, head_dim]."""
    def split(name):
        past_key_values = torch.tensor(np.asarray(P.PrefixTuning.rows(trained[name])))[None]
        bsz, seqlen, _ = past_key_values.shape
        past_key_values = past_key_values.view(bsz, seqlen, layers * 2, heads, head_dim)
        return past_key_values.permute([2, 0, 3, 1, 4]).split(2)
    self_kv, cross_kv, enc_kv = split("prefix"), split("prefix_cross"), split("prefix_encoder")
    return [{"self": {"prev_key": kv[0], "prev_value": kv[1]},
             "encoder_decoder": {"prev_key": cross_kv[i][0], "prev_value": cross_kv[i][1]},
             "encoder": {"prev_key": enc_kv[i][0], "prev_value": enc_kv[i][1]}} for i, kv in enumerate(self_kv)]


def _li_liang_reference(model, trained, torch_inputs):
    """Li and Liang's placement on Hugging Face's T5, their prefixes (`_li_liang_past_key_values`)
    put in its attentions by hand: every encoder self-attention sees its prefix as N cached earlier
    positions (the tokens' positions shifted by N, as in the decoder), the decoder's
    self-attentions the same way, and each cross-attention's keys and values are its prefix before
    the encoder output's projections, seen by every query."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache
    cfg = model.config
    b, layers, h, hd = torch_inputs["input_ids"].shape[0], cfg.num_layers, cfg.num_heads, cfg.d_kv
    prompts = _li_liang_past_key_values(trained, layers, h, hd)

    def kv(i, kind):   # layer i's keys, values [b, h, N, hd]
        return [prompts[i][kind][k].expand(b, -1, -1, -1).contiguous() for k in ("prev_key", "prev_value")]

    mask = torch.tensor(np.concatenate([np.ones((b, N), np.int64), torch_inputs["attention_mask"]], 1))
    with torch.no_grad():
        for i, block in enumerate(model.encoder.block):   # the encoder stack passes no cache: give each layer its own
            cache = DynamicCache()
            for j in range(i + 1):
                cache.update(*kv(j, "encoder"), j)
            attention, forward = block.layer[0].SelfAttention, block.layer[0].SelfAttention.forward
            # the cache argument's name differs across transformers versions ("cache" from 5.24 on);
            # 4.x places the queries at cache_position (the stack's, from 0), 5.x after the cache
            params = inspect.signature(forward).parameters
            given = {"cache" if "cache" in params else "past_key_values": cache}
            if "cache_position" in params:
                given["cache_position"] = torch.arange(N, N + torch_inputs["input_ids"].shape[1])
            attention.forward = lambda *a, _f=forward, _g=given, **k: _f(*a, **{**k, **_g})
        encoded = model.encoder(input_ids=torch.tensor(torch_inputs["input_ids"]), attention_mask=mask).last_hidden_state
        self_cache, cross_cache = DynamicCache(), DynamicCache()
        for i, block in enumerate(model.decoder.block):
            self_cache.update(*kv(i, "self"), i)
            cross = block.layer[1].EncDecAttention
            keys, values = ((proj(encoded).view(b, -1, h, hd).transpose(1, 2)) for proj in (cross.k, cross.v))
            prefix_k, prefix_v = kv(i, "encoder_decoder")
            cross_cache.update(torch.cat([prefix_k, keys], 2), torch.cat([prefix_v, values], 2), i)
        cache = EncoderDecoderCache(self_cache, cross_cache)
        for i in range(layers):
            cache.is_updated[i] = True   # the cross-attentions read their keys and values from the cache
        padded = torch.cat([torch.zeros(b, N, cfg.d_model), encoded], 1)   # only its length is read
        return model(encoder_outputs=(padded,), attention_mask=mask, past_key_values=cache,
                     decoder_input_ids=torch.tensor(torch_inputs["decoder_input_ids"])).logits.numpy()


@pytest.mark.parametrize("projection", [False, True], ids=["embedding", "projection"])
def test_li_liang_placement_equals_their_prefixes_on_hugging_face_t5(projection, tmp_path):
    """PrefixTuning(placement='li_liang') on T5: Li and Liang's three prefix encoders (the
    encoder's self-attentions, the decoder's self-attentions, its cross-attentions) give the logits
    of Hugging Face's T5 with their code's prefixes put in its attentions by hand (looped and
    scanned layers); a peft folder is refused in one line."""
    model, _, module, base, torch_inputs, features = _setup("t5", tmp_path)
    kwargs = dict(num_virtual_tokens=N, prefix_projection=projection, encoder_hidden_size=24 if projection else None)
    method, peft_method = P.PrefixTuning(placement="li_liang", **kwargs), P.PrefixTuning(**kwargs)
    trained, specs = method.init(jax.random.PRNGKey(0), base, P.logical_specs(module), module.config)
    peft_trained, _ = peft_method.init(jax.random.PRNGKey(0), base, P.logical_specs(module), module.config)
    assert set(trained) == {"params", "prefix", "prefix_cross", "prefix_encoder"}
    assert P.count(trained) == 3 * P.count(peft_trained)   # three prefix encoders of peft's shape (3 + 3 layers)
    jax.tree.map(lambda x, s: len(s) == x.ndim or pytest.fail(f"{s} for {x.shape}"), trained, specs,
                 is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
    params = method.combine(base, trained)
    ours = _apply(module, params, features)
    assert not np.allclose(ours, _apply(module, peft_method.combine(base, peft_trained), features), rtol=RTOL,
                           atol=ATOL)
    inputs = {k: jnp.asarray(v) for k, v in features.items()}
    squared_logits = lambda t: jnp.sum(module.apply({"params": method.combine(base, t)}, **inputs) ** 2)
    grads = jax.jit(jax.grad(squared_logits))(trained)
    for name in ("prefix", "prefix_cross", "prefix_encoder"):   # all three train, every key and value column
        jax.tree.map(lambda g: np.any(np.asarray(g) != 0) or pytest.fail(f"{name}: no gradient"), grads[name])
        if not projection:
            assert np.all(np.any(np.asarray(grads[name]["embedding"]) != 0, axis=0)), name
    ref = _li_liang_reference(model, trained, torch_inputs)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)
    scanned_module, scanned = hf.load(str(tmp_path / "base"), scan_layers=True)
    np.testing.assert_allclose(_apply(scanned_module, method.combine(scanned["params"], trained), features), ref,
                               rtol=RTOL, atol=ATOL)
    with pytest.raises(hf.HFConversionError, match="li_liang.*no peft equivalent"):
        hf.save_adapter(module, method, trained, str(tmp_path / "adapter"), str(tmp_path / "base"))
    with pytest.raises(ConfigError, match="placement"):
        P.PrefixTuning(placement="both")


def test_li_liang_gives_each_layer_its_own_prefix(tmp_path):
    """With 2 + 2 layers (where peft's row layout, 4i mod 2L, would hand decoder layers 0 and 1 the
    same rows) every layer's self-, cross- and encoder prefix is its own: the keys and values of
    Li and Liang's get_prompt_p5 for that layer (`_li_liang_past_key_values`), all different."""
    config = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20)
    transformers.T5ForConditionalGeneration(config).save_pretrained(str(tmp_path / "base"))
    module, variables = hf.load(str(tmp_path / "base"))
    method = P.PrefixTuning(num_virtual_tokens=N, placement="li_liang")
    trained, _ = method.init(jax.random.PRNGKey(0), variables["params"], P.logical_specs(module), module.config)
    params = method.combine(variables["params"], trained)
    theirs = _li_liang_past_key_values(trained, 2, 4, 8)
    seen = []
    for i in range(2):
        for stack, sublayer, kind in (("decoder", "self_attention", "self"),
                                      ("decoder", "cross_attention", "encoder_decoder"),
                                      ("encoder", "self_attention", "encoder")):
            for ours, prev in (("prefix_key", "prev_key"), ("prefix_value", "prev_value")):
                got = np.asarray(params[stack][f"layers_{i}"][sublayer][ours])   # [N, heads, head_dim]
                np.testing.assert_array_equal(got, theirs[i][kind][prev][0].permute(1, 0, 2).numpy())
                seen.append(got)
    assert all(not np.array_equal(a, b) for j, a in enumerate(seen) for b in seen[j + 1:])


def _log_probs(logits):
    return np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), -1))


@pytest.mark.parametrize("family,placement", [("t5", "peft"), ("gpt2", "peft"), ("t5", "li_liang")])
def test_prefix_tuning_decodes_with_the_kv_cache_as_the_full_pass(family, placement, tmp_path):
    """Greedy decoding (and beam search's best beam) with the KV cache gives the argmax tokens (and
    the log-probability) of a full forward pass over the prompt and the decoded tokens (with Li and
    Liang's placement too: the cross-attention prefix beside the cached encoder keys)."""
    from conftest import random_variables
    from t5lite.infer import decoding
    from t5lite.infer.predict import decoded_lengths
    _, _, module, _, _, features = _setup(family, tmp_path)
    base = nn.unbox(random_variables(module, scale=0.5))["params"]   # HF's tiny init decodes padding only
    method = P.PrefixTuning(num_virtual_tokens=N, prefix_projection=True, placement=placement)
    trained, _ = method.init(jax.random.PRNGKey(1), base, P.logical_specs(module), module.config)
    params = method.combine(base, trained)
    steps = 6
    if family == "t5":
        inputs = {"encoder_input_tokens": jnp.asarray(features["encoder_input_tokens"])}
    else:
        prompt = features["decoder_input_tokens"][:, :5].copy()
        prompt[1, 3:] = 0   # prompts of 5 and 3 tokens (GPT-2's pad id is 0 here)
        inputs = {"decoder_prompt_tokens": jnp.asarray(prompt), "decoder_prompt_lengths": jnp.asarray([5, 3])}
    greedy = decoding.greedy(module, params, inputs, max_decode_length=steps)
    beams = decoding.beam_search(module, params, inputs, max_decode_length=steps, num_beams=3, alpha=0.0)
    plain = decoding.greedy(module, base, inputs, max_decode_length=steps)
    assert not np.array_equal(greedy.tokens, plain.tokens)   # the prefix changes what is decoded

    def full_pass(row, tokens):   # (argmax [steps], log-prob of `tokens`) of one uncached forward pass
        tokens = np.asarray(tokens)
        if family == "t5":
            dec = np.concatenate([[0], tokens[:-1]])[None]
            logits = _apply(module, params, dict(encoder_input_tokens=features["encoder_input_tokens"][row:row + 1],
                                                 decoder_input_tokens=dec))[0]
        else:
            given = prompt[row, :int(inputs["decoder_prompt_lengths"][row])]
            ids = np.concatenate([given, tokens[:-1]])[None]
            logits = _apply(module, params, dict(decoder_input_tokens=ids))[0, len(given) - 1:]
        lp = _log_probs(logits)
        return logits.argmax(-1), lp[np.arange(len(tokens)), tokens].sum()

    until_eos = lambda tokens: np.asarray(tokens)[:decoded_lengths(np.asarray(tokens)[None], 1)[0]]
    for row in range(2):
        tokens = until_eos(greedy.tokens[row])
        argmax, log_prob = full_pass(row, tokens)
        np.testing.assert_array_equal(argmax, tokens)
        np.testing.assert_allclose(greedy.scores[row], log_prob, rtol=1e-4)
        best = until_eos(beams.tokens[row, 0])
        np.testing.assert_allclose(beams.scores[row, 0], full_pass(row, best)[1], rtol=1e-4)


def test_prefix_tuning_train_steps_keep_the_base_bit_identical(tmp_path):
    """PrefixTuning (with the projection) on GPT-2 through TrainTask: the state is the prefix
    encoder alone (peft's count), AdamW's state is two moments per trained leaf and nothing for
    the base, the base stays bit-identical while every prefix leaf moves, and 2 accumulated
    microbatches give the gradient of the whole batch."""
    import optax
    from t5lite.train.partitioning import Partitioner
    from t5lite.train.step import TrainTask
    _, _, module, base, _, _ = _setup("gpt2", tmp_path)
    config = module.config.replace(dropout_rate=0.0)
    rng = np.random.RandomState(0)
    tokens = rng.randint(1, V, (4, 9))
    batch = {"decoder_input_tokens": tokens[:, :-1], "decoder_target_tokens": tokens[:, 1:],
             "decoder_loss_weights": np.ones((4, 8))}
    batch = {k: jnp.asarray(v, jnp.float32 if "weights" in k else jnp.int32) for k, v in batch.items()}
    method = P.PrefixTuning(num_virtual_tokens=3, prefix_projection=True, encoder_hidden_size=16)
    states = {}
    for microbatches in (1, 2):
        task = TrainTask(config, optax.adam(1e-2), optax.constant_schedule(1e-2), Partitioner(),
                         {k: 8 for k in batch}, num_microbatches=microbatches, peft=method)
        frozen = task.init_base(0, base)
        before = jax.tree.map(np.asarray, frozen)
        state = task.init_state(0, frozen)
        assert task.num_params == P.count(state.params) == 3 * 32 + 32 * 16 + 16 + 16 * 192 + 192
        assert sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim) == 2 * task.num_params
        start = jax.tree.map(np.asarray, state.params)
        step = task.jit_train_step(frozen)
        for _ in range(3):
            state, metrics = step(state, batch)
        assert np.isfinite(metrics["loss"])
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), frozen, before)
        moved = jax.tree.map(lambda a, b: not np.array_equal(np.asarray(a), b), state.params, start)
        assert jax.tree.leaves(moved) and all(jax.tree.leaves(moved))
        states[microbatches] = state.params
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), states[1], states[2])


def test_prefix_tuning_run_resumes_infers_and_converts_both_ways(tmp_path, micro_config):
    """A prefix-tuning run on a tiny T5 base: its checkpoint holds only the prefix encoder (little
    optimizer state), it resumes, inference reads it as the base plus the prefix; `convert --to_hf`
    writes a base and a peft folder that peft runs to the same logits, and `convert --from_hf BASE
    --peft_adapter DIR` reads that folder back as a PEFT run on the imported base; `--merge` is refused."""
    import orbax.checkpoint as ocp
    from conftest import train_tiny
    from t5lite import cli
    from t5lite.errors import CheckpointError
    from t5lite.infer import checkpoint_reader, peft_checkpoint, predict
    from t5lite.interop import checkpoint as interop_checkpoint
    from t5lite.models import build
    from t5lite.train.partitioning import Partitioner
    base_dir, run = tmp_path / "base", tmp_path / "prefix"
    train_tiny(base_dir, micro_config, 1)
    method = P.PrefixTuning(num_virtual_tokens=3, prefix_projection=True, encoder_hidden_size=8)
    train_tiny(run, micro_config, 3, peft=method, initial_checkpoint_path=str(base_dir), num_microbatches=2)
    step_dir = checkpoint_reader.step_directory(str(run / "checkpoints"))
    stored = ocp.StandardCheckpointer().metadata(os.path.join(step_dir, "state")).item_metadata
    assert set(stored["params"]) == {"params", "prefix"} and not stored["params"]["params"]
    trained_size = P.count(stored["params"])
    assert trained_size == 3 * 32 + 32 * 8 + 8 + 8 * (2 * 32) + 2 * 32   # 1 encoder layer: 2 rows of 2 x 16
    assert P.count(stored["opt_state"]) <= 2 * trained_size + 16   # Adafactor: one (factored) accumulator each
    train_tiny(run, micro_config, 5, peft=method, initial_checkpoint_path=str(base_dir))
    assert checkpoint_reader.step_directory(str(run / "checkpoints")).endswith("5")
    params, _, _ = predict.load_params(micro_config, str(run))
    assert params["decoder"]["layers_0"]["self_attention"]["prefix_key"].shape == (3, 2, 16)
    module = build(micro_config)
    enc = np.array([[5, 6, 7, 1, 0, 0], [9, 10, 11, 12, 13, 1]])
    tokens, _, _ = predict.Predictor(module, params, max_decode_length=4)({"encoder_input_tokens": enc})
    sharded, _, _ = predict.Predictor(module, params, Partitioner((1, 1, 1), devices=jax.devices()[:1]),
                                      max_decode_length=4)({"encoder_input_tokens": enc})
    np.testing.assert_array_equal(tokens, sharded)
    dec = np.concatenate([np.zeros((2, 1), int), np.asarray(tokens)[:, :-1]], 1)
    features = dict(encoder_input_tokens=enc, decoder_input_tokens=dec)
    ours = _apply(module, params, features)
    with pytest.raises(CheckpointError, match="does not merge"):
        interop_checkpoint.merge_peft_run(str(run), str(tmp_path / "merged"))
    cli.main(["convert", "--to_hf", str(run), "--out", str(tmp_path / "hf")])
    hf_base = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "hf" / "base")).eval()
    theirs = peft.PeftModel.from_pretrained(hf_base, str(tmp_path / "hf" / "adapter")).eval()
    ref = _torch(theirs, dict(input_ids=enc, attention_mask=(enc != 0).astype(np.int64), decoder_input_ids=dec))
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)
    imported = tmp_path / "imported"
    cli.main(["convert", "--from_hf", str(tmp_path / "hf" / "base"), "--peft_adapter", str(tmp_path / "hf" / "adapter"),
              "--out", str(imported)])
    assert peft_checkpoint.read(str(imported))["method"] == "PrefixTuning"
    params, _, _ = predict.load_params(micro_config, str(imported))
    np.testing.assert_allclose(_apply(module, params, features), ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("preset,pooling", [("bert_tiny", "first"), ("t5_tiny", "mean"), ("gpt2_tiny", "last")])
def test_prefix_tuning_under_a_task_head(preset, pooling):
    """With a task head the prefixes sit in the backbone's attentions and the head trains too
    (peft's modules_to_save); the count is the prefix rows plus the head."""
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
    method = P.PrefixTuning(num_virtual_tokens=4)
    trained, _ = method.init(jax.random.PRNGKey(1), base, specs, config)
    assert set(trained["params"]) == {"head"}
    rows = 2 * (config.num_decoder_layers if config.arch == "decoder" else config.num_encoder_layers)
    assert P.count(trained) == 4 * rows * config.num_heads * config.head_dim + P.count(trained["params"])
    params = method.combine(base, trained)
    stack = "decoder" if config.arch == "decoder" else "encoder"   # a T5 classifier runs (and has) its encoder only
    assert params["backbone"][stack]["layers_0"]["self_attention"]["prefix_key"].shape == (
        4, config.num_heads, config.head_dim)
    with_prefix = model.apply({"params": params}, **features)
    assert with_prefix.shape == (2, 3) and not np.allclose(with_prefix, model.apply({"params": base}, **features))


@pytest.mark.parametrize("family", ["t5", "gpt2"])
def test_prefix_tuning_packed_examples_each_see_the_prefix(family, tmp_path):
    """Two examples packed in one row (segment ids, positions restarting at 0) give the logits each
    gives alone: every segment sees the whole prefix at the same offsets (those checked against peft)."""
    _, _, module, base, _, _ = _setup(family, tmp_path)
    method = P.PrefixTuning(num_virtual_tokens=N)
    trained, _ = method.init(jax.random.PRNGKey(2), base, P.logical_specs(module), module.config)
    params = method.combine(base, trained)
    a, b = _ids((1, 5), 2, 7), _ids((1, 4), 2, 8)
    packed = lambda x, y: np.concatenate([x, y], 1)
    segments = packed(np.ones_like(a), 2 * np.ones_like(b))
    positions = packed(np.arange(5)[None], np.arange(4)[None])
    if family == "gpt2":
        alone = [_apply(module, params, dict(decoder_input_tokens=x)) for x in (a, b)]
        both = _apply(module, params, dict(decoder_input_tokens=packed(a, b), decoder_segment_ids=segments,
                                           decoder_positions=positions))
    else:
        enc_a, enc_b = _ids((1, 6), 2, 9), _ids((1, 3), 2, 10)
        alone = [_apply(module, params, dict(encoder_input_tokens=e, decoder_input_tokens=d))
                 for e, d in ((enc_a, a), (enc_b, b))]
        both = _apply(module, params, dict(
            encoder_input_tokens=packed(enc_a, enc_b), decoder_input_tokens=packed(a, b),
            encoder_segment_ids=packed(np.ones_like(enc_a), 2 * np.ones_like(enc_b)), decoder_segment_ids=segments,
            encoder_positions=packed(np.arange(6)[None], np.arange(3)[None]), decoder_positions=positions))
    np.testing.assert_allclose(both, np.concatenate(alone, 1), rtol=RTOL, atol=ATOL)


def test_prefix_tuning_config_errors():
    from t5lite.models import get_config
    with pytest.raises(ConfigError, match="num_virtual_tokens"):
        P.PrefixTuning(num_virtual_tokens=0)
    with pytest.raises(ConfigError, match="ALBERT"):
        P.PrefixTuning.num_rows(get_config("albert_tiny"))
    with pytest.raises(ConfigError, match="decoder has 3"):
        P.PrefixTuning.num_rows(get_config("t5_tiny", num_encoder_layers=2, num_decoder_layers=3))


def test_prefix_tuning_gin_file_binds_the_method():
    import gin
    from conftest import REPO
    from t5lite.train import trainer  # noqa: F401  registers PrefixTuning
    gin.clear_config()
    gin.parse_config_file(str(REPO / "gin" / "peft" / "prefix_tuning.gin"))
    method = gin.query_parameter("train.peft").scoped_configurable_fn()
    assert method == P.PrefixTuning(num_virtual_tokens=20)
    gin.clear_config()
