"""ELMo: character ids, the biLM's pieces against numpy / torch re-derivations, and the original
TensorFlow bilm's outputs on allennlp's fixture (../shared/data/elmo)."""
from __future__ import annotations

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import shared_data_dir
from t5lite.data import elmo_chars
from t5lite.errors import CheckpointError, CheckpointNotFoundError
from t5lite.interop import elmo
from t5lite.models.recurrent import BiLM, BiLMConfig, CharCNN, LSTMLayer, lstm_step

ELMO = shared_data_dir() / "elmo"


def _allennlp_ids(token: bytes | int) -> list[int]:
    """allennlp's ELMoCharacterMapper: bow 258, bytes (at most 48), eow 259, pad 260, then +1;
    the sentence boundaries are the single 'bytes' 256 and 257."""
    code = [token] if isinstance(token, int) else list(token[:48])
    ids = [258] + code + [259] + [260] * (50 - len(code) - 2)
    return [i + 1 for i in ids]


def test_char_ids_match_allennlp_definition():
    long_word = "x" * 60
    for token in ["cat", "U.S.", "naïve", "日本", long_word]:
        assert elmo_chars.token_char_ids(token).tolist() == _allennlp_ids(token.encode("utf-8"))
    assert elmo_chars.BOS_IDS.tolist() == _allennlp_ids(256)
    assert elmo_chars.EOS_IDS.tolist() == _allennlp_ids(257)
    assert elmo_chars.token_char_ids("cat")[:5].tolist() == [259, 100, 98, 117, 260]


def test_batch_char_ids_adds_boundaries_and_zero_padding():
    ids, lengths = elmo_chars.batch_char_ids([["a", "b"], []])
    assert lengths.tolist() == [4, 2]
    assert ids.shape == (2, 4, 50)
    assert ids[0, 0].tolist() == _allennlp_ids(256) and ids[0, 3].tolist() == _allennlp_ids(257)
    assert ids[1, 1].tolist() == _allennlp_ids(257)
    assert not ids[1, 2:].any()


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _np_lstm_step(w, b, p, c, h, x, cell_clip, proj_clip):
    """TF's LSTMCell with num_proj: gates i, j, f, o; forget bias 1; clip c, project, clip h."""
    z = np.concatenate([x, h], -1) @ w + b
    i, j, f, o = np.split(z, 4, -1)
    c = np.clip(_sigmoid(f + 1.0) * c + _sigmoid(i) * np.tanh(j), -cell_clip, cell_clip)
    h = np.clip((_sigmoid(o) * np.tanh(c)) @ p, -proj_clip, proj_clip)
    return c, h


def test_lstm_with_projection_and_clips_matches_numpy():
    rng = np.random.default_rng(0)
    n_in, hidden, proj, batch = 5, 8, 3, 2
    w = rng.normal(0, 1.0, (n_in + proj, 4 * hidden)).astype(np.float32)
    b = rng.normal(0, 1.0, 4 * hidden).astype(np.float32)
    p = rng.normal(0, 1.0, (hidden, proj)).astype(np.float32)
    c = rng.normal(0, 2.0, (batch, hidden)).astype(np.float32)
    h = rng.normal(0, 1.0, (batch, proj)).astype(np.float32)
    x = rng.normal(0, 1.0, (batch, n_in)).astype(np.float32)
    want = _np_lstm_step(w, b, p, c, h, x, 0.5, 0.3)
    got = lstm_step({"kernel": w, "bias": b, "proj": p}, (c, h), x, cell_clip=0.5, proj_clip=0.3)
    assert np.abs(want[1]).max() == pytest.approx(0.3)  # the clips are active
    for g, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-5, atol=1e-6)


def test_lstm_without_projection_matches_torch():
    torch = pytest.importorskip("torch", reason="torch (the hf extra) is the reference LSTM")
    n_in, hidden, steps = 4, 6, 7
    ref = torch.nn.LSTM(n_in, hidden, batch_first=True)
    x = torch.randn(2, steps, n_in, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, _ = ref(x)
    i, f, g, o = np.split(ref.weight_ih_l0.detach().numpy(), 4)
    ih = np.concatenate([i, g, f, o]).T
    i, f, g, o = np.split(ref.weight_hh_l0.detach().numpy(), 4)
    hh = np.concatenate([i, g, f, o]).T
    i, f, g, o = np.split((ref.bias_ih_l0 + ref.bias_hh_l0).detach().numpy(), 4)
    params = {"kernel": np.concatenate([ih, hh]), "bias": np.concatenate([i, g, f - 1.0, o]),
              "proj": np.eye(hidden, dtype=np.float32)}
    cfg = BiLMConfig(lstm_dim=hidden, projection_dim=hidden, cell_clip=None, proj_clip=None)
    zeros = (np.zeros((2, hidden), np.float32),) * 2
    got, _ = LSTMLayer(cfg, n_in).apply({"params": params}, x.numpy(), np.array([steps, steps]), zeros)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-6)


def _np_char_cnn(params, cfg: BiLMConfig, ids):
    """The bilm's char CNN: embed (id 0 -> zeros), VALID conv per filter, max over chars, relu,
    highway carry * relu(x Wt + bt) + (1 - carry) * x with carry = sigmoid(x Wc + bc), projection."""
    table = params["char_embed"].copy()
    table[0] = 0.0
    x = table[ids]
    pooled = []
    for k, (width, n) in enumerate(cfg.filters):
        w, b = params[f"conv_{k}_kernel"], params[f"conv_{k}_bias"]
        out = np.stack([np.einsum("...we,wef->...f", x[..., t:t + width, :], w)
                        for t in range(x.shape[-2] - width + 1)], -2) + b
        pooled.append(out.max(-2))
    h = np.maximum(np.concatenate(pooled, -1), 0.0)
    for k in range(cfg.n_highway):
        carry = _sigmoid(h @ params[f"highway_{k}_carry_kernel"] + params[f"highway_{k}_carry_bias"])
        relu = np.maximum(h @ params[f"highway_{k}_transform_kernel"]
                          + params[f"highway_{k}_transform_bias"], 0.0)
        h = carry * relu + (1.0 - carry) * h
    return h @ params["proj_kernel"] + params["proj_bias"]


def test_char_cnn_and_highway_match_numpy():
    cfg = BiLMConfig(filters=((1, 3), (3, 5)), char_embed_dim=4, n_highway=2, projection_dim=6)
    ids, _ = elmo_chars.batch_char_ids([["a", "word"], ["x"]])
    module = CharCNN(cfg)
    params = nn.unbox(module.init(jax.random.PRNGKey(0), ids))["params"]
    params = jax.tree.map(lambda p: np.asarray(p) + np.random.default_rng(1).normal(0, 0.5, p.shape)
                          .astype(np.float32), params)
    got = module.apply({"params": params}, ids)
    np.testing.assert_allclose(np.asarray(got), _np_char_cnn(params, cfg, ids), rtol=1e-5, atol=1e-6)


def test_bilm_params_have_logical_axes():
    cfg = BiLMConfig(filters=((1, 4), (2, 4)), char_embed_dim=4, lstm_dim=8, projection_dim=4)
    ids, lengths = elmo_chars.batch_char_ids([["a", "b"]])
    variables = BiLM(cfg).init(jax.random.PRNGKey(0), ids, lengths)
    specs = nn.get_partition_spec(variables)["params"]
    assert tuple(specs["forward_1"]["kernel"]) == ("lstm_in", "lstm_gates")
    assert tuple(specs["char_cnn"]["char_embed"]) == ("char_vocab", "embed")


def _fixture():
    module, variables = elmo.load(str(ELMO / "options.json"), str(ELMO / "lm_weights.hdf5"))
    lists = json.loads((ELMO / "sentences.json").read_text())
    # The original ran batches of 3: batch k held the k-th sentence of each list.
    order = [(k, j) for k in range(len(lists[0])) for j in range(len(lists))]
    return module, variables, [lists[j][k].split() for k, j in order], order


def _reference(k: int, j: int) -> np.ndarray:
    h5py = pytest.importorskip("h5py", reason="h5py reads the reference outputs")
    with h5py.File(ELMO / f"lm_embeddings_{j}.hdf5", "r") as f:
        forward, backward = f[str(k)][...]
    return np.concatenate([forward, backward], -1)


def _assert_reference(out, k, j):
    want = _reference(k, j)
    np.testing.assert_allclose(out[-1], want, rtol=1e-5, atol=1e-5 * np.abs(want).max(),
                               err_msg=f"list {j}, sentence {k}")


def test_stateful_embedder_reproduces_tensorflow_bilm_over_consecutive_calls():
    """The fixture: 10 calls of bilm-tf's model on batches of 3, LSTM states kept per row between
    calls (bilm/model.py, _build_lstms: tf.Variable states updated after each call), as allennlp's
    tests/modules/elmo_test.py::test_elmo_bilm feeds its stateful _ElmoBiLm."""
    pytest.importorskip("h5py", reason="the bilm weights are hdf5")
    module, variables, sentences, order = _fixture()
    embedder = elmo.Embedder(module, variables)  # stateful by default, as allennlp's Elmo
    for call in range(10):
        batch = sentences[3 * call:3 * call + 3]
        layers = embedder.embed_batch(batch)
        for (k, j), sentence, out in zip(order[3 * call:3 * call + 3], batch, layers):
            assert out.shape == (3, len(sentence), 32)
            np.testing.assert_allclose(out[0, :, :16], out[0, :, 16:])  # layer 0 duplicated
            _assert_reference(out, k, j)
    # reset_states starts over: the first call's outputs again.
    embedder.reset_states()
    for (k, j), out in zip(order[:3], embedder.embed_batch(sentences[:3])):
        _assert_reference(out, k, j)


def test_embed_and_stateless_embedder_start_each_batch_from_zeros():
    module, variables, sentences, order = _fixture()
    layers = elmo.embed(module, variables, sentences, batch_size=3)
    assert len(layers) == 30
    stateless = elmo.Embedder(module, variables, stateful=False).embed_sentences(sentences, batch_size=3)
    for (k, j), out, again in zip(order, layers, stateless):
        np.testing.assert_array_equal(out, again)
        if k == 0:  # only the first batch of the original started from zeros
            _assert_reference(out, k, j)
        else:
            assert not np.allclose(out[-1], _reference(k, j), rtol=1e-5, atol=1e-5)


def test_reset_states_of_some_rows():
    """allennlp's _EncoderBase.reset_states(mask) zeroes only the masked rows' states."""
    module, variables, sentences, order = _fixture()
    embedder = elmo.Embedder(module, variables)
    embedder.embed_batch(sentences[:3])
    embedder.reset_states(rows=[1])
    out = embedder.embed_batch(sentences[3:6])
    for b in (0, 2):
        _assert_reference(out[b], *order[3 + b])
    np.testing.assert_allclose(out[1], elmo.embed(module, variables, [sentences[4]])[0], rtol=1e-5, atol=1e-6)


def test_states_are_kept_per_batch_row_across_batch_sizes():
    """bilm-tf's update after each call (bilm/model.py, _build_lstms): new_state =
    concat([final_state[:batch_size], init_state[batch_size:]]), so each row continues only its own
    history and rows past a smaller batch keep theirs; allennlp's _EncoderBase grows its states with
    zeros for new rows. Rows are thus independent streams of sentences."""
    module, variables, sentences, _ = _fixture()
    short = [sentences[i] for i in (4, 9, 10, 14, 15, 16, 22, 23, 28)]  # one compiled length
    batches = [short[0:3], short[3:4], short[4:6], short[6:9]]
    embedder = elmo.Embedder(module, variables)
    got = [embedder.embed_batch(batch) for batch in batches]
    rows = [elmo.Embedder(module, variables) for _ in range(3)]
    for batch, outs in zip(batches, got):
        for b, (sentence, out) in enumerate(zip(batch, outs)):
            alone = rows[b].embed_batch([sentence])[0]
            np.testing.assert_allclose(out, alone, rtol=1e-5, atol=1e-5 * np.abs(alone).max())
    # The first call starts from zeros, so it is the stateless embedding.
    np.testing.assert_allclose(got[0][2], elmo.embed(module, variables, short[:3])[2], rtol=1e-6, atol=1e-6)


def test_load_names_missing_and_wrong_files(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="options.json"):
        elmo.load(str(tmp_path / "options.json"), str(tmp_path / "w.hdf5"))
    h5py = pytest.importorskip("h5py", reason="the bilm weights are hdf5")
    (tmp_path / "options.json").write_text(json.dumps({
        "char_cnn": {"filters": [[1, 4]], "embedding": {"dim": 4}, "n_characters": 262,
                     "n_highway": 1, "activation": "relu"},
        "lstm": {"dim": 8, "projection_dim": 4, "n_layers": 1}}))
    with h5py.File(tmp_path / "w.hdf5", "w") as f:
        f["char_embed"] = np.zeros((261, 4), np.float32)
    with pytest.raises(CheckpointError, match="not a bilm weights file"):
        elmo.load(str(tmp_path / "options.json"), str(tmp_path / "w.hdf5"))


def _np_scalar_mix(scalars, gamma, layers, mask=None):
    """allennlp's ScalarMix.forward: softmax weights; with a mask, each layer normalised by one
    mean and variance over the unmasked elements of the whole tensor (eps 1e-13)."""
    w = np.exp(scalars - scalars.max())
    w = w / w.sum()
    if mask is not None:
        m = mask[..., None].astype(np.float64)
        n = mask.sum() * layers.shape[-1]
        normed = []
        for t in layers:
            mean = (t * m).sum() / n
            var = (((t * m - mean) * m) ** 2).sum() / n
            normed.append((t - mean) / np.sqrt(var + 1e-13))
        layers = np.stack(normed)
    return gamma * sum(wk * t for wk, t in zip(w, layers))


@pytest.mark.parametrize("layer_norm", [False, True])
def test_scalar_mix_matches_allennlp_formula(layer_norm):
    from t5lite.models.scalar_mix import ScalarMix

    rng = np.random.default_rng(0)
    layers = rng.normal(1.0, 2.0, (3, 2, 5, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    mix = ScalarMix(3, do_layer_norm=layer_norm)
    variables = nn.unbox(mix.init(jax.random.PRNGKey(0), layers, mask))
    np.testing.assert_allclose(np.asarray(variables["params"]["scalars"]), 0.0)
    np.testing.assert_allclose(np.asarray(variables["params"]["gamma"]), 1.0)
    scalars, gamma = np.array([0.3, -1.2, 0.7], np.float32), np.float32(1.7)
    got = mix.apply({"params": {"scalars": scalars, "gamma": gamma}}, layers, mask)
    want = _np_scalar_mix(scalars, gamma, layers, mask if layer_norm else None)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_scalar_mix_over_elmo_layers():
    from t5lite.models.scalar_mix import ScalarMix

    module, variables, sentences, _ = _fixture()
    layers = elmo.embed(module, variables, sentences[:1])[0]
    mix = ScalarMix(len(layers))
    out = mix.apply(nn.unbox(mix.init(jax.random.PRNGKey(0), layers)), layers)
    np.testing.assert_allclose(np.asarray(out), layers.mean(0), rtol=1e-5, atol=1e-6)


def test_save_writes_the_original_files(tmp_path):
    h5py = pytest.importorskip("h5py", reason="the bilm weights are hdf5")
    module, variables = elmo.load(str(ELMO / "options.json"), str(ELMO / "lm_weights.hdf5"))
    elmo.save(module, variables, str(tmp_path / "options.json"), str(tmp_path / "w.hdf5"))
    original = {}
    with h5py.File(ELMO / "lm_weights.hdf5", "r") as f:
        f.visititems(lambda name, obj: original.update({name: obj[...]})
                     if isinstance(obj, h5py.Dataset) else None)
    with h5py.File(tmp_path / "w.hdf5", "r") as f:
        written = {}
        f.visititems(lambda name, obj: written.update({name: obj[...]})
                     if isinstance(obj, h5py.Dataset) else None)
    assert sorted(written) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    options = json.loads((ELMO / "options.json").read_text())
    assert BiLMConfig.from_options(json.loads((tmp_path / "options.json").read_text())) == \
        BiLMConfig.from_options(options)


def test_save_then_load_round_trips_a_fresh_bilm(tmp_path):
    pytest.importorskip("h5py", reason="the bilm weights are hdf5")
    cfg = BiLMConfig(filters=((1, 4), (2, 4)), char_embed_dim=4, lstm_dim=8, projection_dim=4)
    ids, lengths = elmo_chars.batch_char_ids([["a", "b"]])
    variables = BiLM(cfg).init(jax.random.PRNGKey(0), ids, lengths)
    elmo.save(BiLM(cfg), variables, str(tmp_path / "o.json"), str(tmp_path / "w.hdf5"))
    module, loaded = elmo.load(str(tmp_path / "o.json"), str(tmp_path / "w.hdf5"))
    assert module.config == cfg
    want = nn.unbox(variables)["params"]
    want["char_cnn"]["char_embed"] = want["char_cnn"]["char_embed"].at[0].set(0.0)
    jax.tree.map(np.testing.assert_array_equal, loaded["params"], want)


def test_user_errors_name_the_input():
    from t5lite.errors import ConfigError
    from t5lite.models.scalar_mix import ScalarMix

    with pytest.raises(ConfigError, match="max_characters_per_token"):
        BiLMConfig.from_options({"char_cnn": {"max_characters_per_token": 40}, "lstm": {}})
    with pytest.raises(ConfigError, match="num_layers"):
        ScalarMix(2).init(jax.random.PRNGKey(0), np.zeros((3, 1, 2, 4), np.float32))


def test_bilm_initialisers_are_bilm_tfs():
    """bilm-tf's bilm/training.py, LanguageModel._build_word_char_embeddings: characters U(-1, 1),
    relu convolutions U(-0.05, 0.05), highway and projection kernels N(0, 1 / fan in), the highway
    carry bias b_carry tf.constant_initializer(-2.0) and transform bias 0; LSTM kernels Glorot
    uniform (TF's default; limit sqrt(6 / (fan in + fan out)))."""
    cfg = BiLMConfig(filters=((1, 64), (2, 64)), char_embed_dim=16, n_highway=1, lstm_dim=128, projection_dim=64)
    params = nn.unbox(BiLM(cfg).init(jax.random.key(0), np.ones((1, 3, 50), np.int32), np.array([3])))["params"]
    cnn = params["char_cnn"]
    char_embed = np.asarray(cnn["char_embed"])
    assert np.abs(char_embed).max() <= 1.0 and np.std(char_embed) == pytest.approx(1 / np.sqrt(3), rel=0.1)
    assert np.abs(np.asarray(cnn["conv_1_kernel"])).max() <= 0.05
    assert np.std(np.asarray(cnn["conv_1_kernel"])) == pytest.approx(0.05 / np.sqrt(3), rel=0.1)
    for name, fan_in in (("highway_0_carry_kernel", 128), ("highway_0_transform_kernel", 128), ("proj_kernel", 128)):
        assert np.std(np.asarray(cnn[name])) == pytest.approx(1 / np.sqrt(fan_in), rel=0.1), name
    np.testing.assert_array_equal(np.asarray(cnn["highway_0_carry_bias"]), np.full(128, -2.0, np.float32))
    np.testing.assert_array_equal(np.asarray(cnn["highway_0_transform_bias"]), np.zeros(128, np.float32))
    kernel = np.asarray(params["forward_0"]["kernel"])
    limit = np.sqrt(6 / (kernel.shape[0] + kernel.shape[1]))
    assert np.abs(kernel).max() <= limit and np.std(kernel) == pytest.approx(limit / np.sqrt(3), rel=0.1)
