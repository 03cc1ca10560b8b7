"""Decoding and scoring against Hugging Face `generate` on the same (random) weights: greedy tokens
identical for T5, BART and GPT-2 on a batch of inputs or prompts of different lengths (GPT-2's
include id 0, left-padded for HF), beam search identical with no length penalty, scores equal to
HF's log-probabilities, and the sampling filters equal to HF's logits warpers."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="HF comparisons need the optional torch dependency (extras 'hf')")
transformers = pytest.importorskip("transformers", reason="HF comparisons need transformers (extras 'hf')")

from t5lite import models  # noqa: E402
from t5lite.infer import decoding, scoring  # noqa: E402
from t5lite.interop import hf  # noqa: E402
from conftest import assert_close  # noqa: E402

V = 97
NEW = 8      # tokens to generate


def _hf_model(name):
    """A tiny random HF model with sharp logits (large init), so argmax has no near-ties."""
    torch.manual_seed(0)
    if name == "t5":
        config = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                       relative_attention_num_buckets=8, relative_attention_max_distance=20,
                                       initializer_factor=2.0, decoder_start_token_id=0, eos_token_id=1,
                                       pad_token_id=0)
        model = transformers.T5ForConditionalGeneration(config)
    elif name == "bart":
        config = transformers.BartConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                         decoder_ffn_dim=64, max_position_embeddings=40, init_std=0.5)
        model = transformers.BartForConditionalGeneration(config)
    else:
        config = transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=40,
                                         initializer_range=0.5, bos_token_id=V - 1, eos_token_id=V - 1)
        model = transformers.GPT2LMHeadModel(config)
    return model.eval()


@pytest.fixture(scope="module", params=["t5", "bart", "gpt2"])
def family(request, tmp_path_factory):
    model = _hf_model(request.param)
    path = str(tmp_path_factory.mktemp(request.param))
    model.save_pretrained(path)
    module, variables = hf.load(path)
    return request.param, model, module, variables["params"]


def _inputs(name, config):
    """Token rows of different lengths: (t5lite inputs, HF generate kwargs, lengths)."""
    rng = np.random.RandomState(3)
    if name == "gpt2":   # decoder-only: prompts with id 0 inside and at the end
        lengths = np.array([5, 2, 7])
        prompt = rng.randint(0, V - 1, (3, 7))
        prompt[0, 4], prompt[1, 1], prompt[2, 2] = 0, 0, 0
        prompt[np.arange(7)[None] >= lengths[:, None]] = config.pad_token_id
        left = np.zeros_like(prompt)           # HF pads on the left
        mask = np.zeros_like(prompt)
        for r, n in enumerate(lengths):
            left[r, 7 - n:], mask[r, 7 - n:] = prompt[r, :n], 1
        ours = {"decoder_prompt_tokens": jnp.asarray(prompt), "decoder_prompt_lengths": jnp.asarray(lengths)}
        return ours, dict(input_ids=torch.tensor(left), attention_mask=torch.tensor(mask)), lengths
    lengths = np.array([9, 4, 6])
    tokens = rng.randint(3, V, (3, 9))
    tokens[np.arange(9)[None] >= lengths[:, None]] = config.pad_token_id
    mask = (np.arange(9)[None] < lengths[:, None]).astype(np.int64)
    ours = {"encoder_input_tokens": jnp.asarray(tokens)}
    return ours, dict(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask)), lengths


def _generate(model, hf_inputs, eos, **kwargs):
    """HF generate with nothing but the search itself (no forced EOS, no min length)."""
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else eos
    with torch.no_grad():
        out = model.generate(**hf_inputs, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=pad,
                             forced_eos_token_id=None, forced_bos_token_id=None, min_length=0,
                             no_repeat_ngram_size=0, return_dict_in_generate=True, output_scores=True, **kwargs)
    start = hf_inputs["input_ids"].shape[1] if not model.config.is_encoder_decoder else 1
    return out, out.sequences[:, start:].numpy()


def _with_eos(module, eos):
    return models.build(module.config.replace(eos_token_id=eos))


def _an_eos_that_occurs(model, hf_inputs):
    """A token greedy decoding emits at step 3 of row 0, used as EOS so rows really end mid-way."""
    _, tokens = _generate(model, hf_inputs, eos=model.config.eos_token_id, do_sample=False)
    return int(tokens[0, 2])


def _until_eos(tokens, eos):
    """1 on each row's tokens up to and including its first EOS."""
    ended = np.cumsum(tokens == eos, axis=1) - (tokens == eos)
    return ended == 0


def _padded(tokens, eos, pad):
    """HF's rows, cut after EOS and padded to NEW with the pad id (HF stops at the longest row)."""
    out = np.full((tokens.shape[0], NEW), pad)
    for r, row in enumerate(tokens):
        row = list(row)
        row = row[:row.index(eos) + 1] if eos in row else row
        out[r, :len(row)] = row
    return out


def test_greedy_is_token_for_token_hf_generate(family):
    name, model, module, params = family
    ours_in, hf_in, _ = _inputs(name, module.config)
    eos = _an_eos_that_occurs(model, hf_in)
    out, hf_tokens = _generate(model, hf_in, eos, do_sample=False, num_beams=1)
    expected = _padded(hf_tokens, eos, module.config.pad_token_id)
    assert (expected == eos).any(1).sum() >= 1 and not (expected == eos).all(), "rows should end at different steps"
    ours = decoding.greedy(_with_eos(module, eos), params, ours_in, max_decode_length=NEW)
    np.testing.assert_array_equal(np.asarray(ours.tokens), expected)
    # The score: HF's per-step log-softmax of the raw logits at the chosen tokens, up to EOS.
    logp = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, out.sequences[:, -len(out.scores):, None])[..., 0]
    counted = _until_eos(expected[:, :logp.shape[1]], eos)
    assert_close(np.asarray(ours.scores), (logp.numpy() * counted).sum(1))


def _hf_token_log_probs(name, model, hf_inputs, lengths, targets, target_lengths):
    """HF forward pass, log-softmax gathered at the targets: [batch, length], 0 past each end.
    Encoder-decoders start from HF's own decoder_start_token_id; GPT-2 continues each prompt."""
    with torch.no_grad():
        if name == "gpt2":   # left-padded prompt, then the targets; positions from the mask
            ids = torch.cat([hf_inputs["input_ids"], torch.tensor(targets)], 1)
            mask = torch.cat([hf_inputs["attention_mask"], torch.ones(targets.shape, dtype=torch.long)], 1)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
            logits = logits[:, hf_inputs["input_ids"].shape[1] - 1:-1]
        else:
            start = model.generation_config.decoder_start_token_id
            decoder_inputs = np.concatenate([np.full((len(targets), 1), start), targets[:, :-1]], 1)
            logits = model(**hf_inputs, decoder_input_ids=torch.tensor(decoder_inputs)).logits
    picked = logits.log_softmax(-1).gather(-1, torch.tensor(targets)[..., None])[..., 0].numpy()
    return np.where(np.arange(targets.shape[1])[None] < target_lengths[:, None], picked, 0.0)


def test_scores_are_hf_log_likelihoods(family):
    """Per-token log-likelihoods of given targets, including id 0 (BART's <s>, GPT-2's "!") and
    the pad id inside a target, equal HF's; rank classification picks among them."""
    name, model, module, params = family
    cfg = module.config
    ours_in, hf_in, lengths = _inputs(name, cfg)
    targets = np.random.RandomState(5).randint(0, V, (3, 5))
    targets[:, 1] = 0
    target_lengths = np.array([5, 3, 4])
    targets[np.arange(5)[None] >= target_lengths[:, None]] = cfg.pad_token_id
    expected = _hf_token_log_probs(name, model, hf_in, lengths, targets, target_lengths)
    ours = scoring.token_log_likelihoods(module, params, ours_in, jnp.asarray(targets),
                                         decoder_target_lengths=jnp.asarray(target_lengths))
    assert_close(np.asarray(ours), expected)
    total = scoring.target_log_likelihood(module, params, ours_in, jnp.asarray(targets), jnp.asarray(target_lengths))
    assert_close(np.asarray(total), expected.sum(1))
    # Candidates without id 0 or pad inside: their lengths are their non-pad tokens.
    candidates = np.full((2, 3), cfg.pad_token_id)
    candidates[0], candidates[1, :2] = [5, 6, 7], [8, 9]
    ranked = np.asarray(scoring.rank_candidates(module, params, ours_in, jnp.asarray(candidates)))
    for c, (candidate, n) in enumerate(zip(candidates, [3, 2])):
        rows = np.repeat(candidate[None], 3, 0)
        assert_close(ranked[:, c], _hf_token_log_probs(name, model, hf_in, lengths, rows,
                                                       np.full(3, n)).sum(1))


def _hf_beams(family, eos, beams):
    """HF's tokens [batch, beams, NEW] padded after EOS and its scores [batch, beams] of a beam search
    with no length penalty (alpha = 0 is HF's length_penalty = 0: summed log-probabilities)."""
    name, model, module, _ = family
    out, hf_tokens = _generate(model, _inputs(name, module.config)[1], eos, do_sample=False, num_beams=beams,
                               num_return_sequences=beams, length_penalty=0.0, early_stopping=False)
    expected = _padded(hf_tokens, eos, module.config.pad_token_id).reshape(-1, beams, NEW)
    return expected, out.sequences_scores.numpy().reshape(-1, beams)


def _beams_and_hf_beams(family, eos, beams):
    """(ours, HF's tokens, HF's scores) of a beam search by HF's rules."""
    name, _, module, params = family
    ours = decoding.beam_search(_with_eos(module, eos), params, _inputs(name, module.config)[0],
                                max_decode_length=NEW, num_beams=beams, alpha=0.0, rules="hf")
    return (ours, *_hf_beams(family, eos, beams))


def test_beam_search_is_hf_beam_search_without_length_penalty(family):
    """Same beams, same order, same scores."""
    _, model, _, _ = family
    eos = _an_eos_that_occurs(model, _inputs(family[0], family[2].config)[1])
    ours, expected, hf_scores = _beams_and_hf_beams(family, eos, beams=3)
    np.testing.assert_array_equal(np.asarray(ours.tokens), expected)
    assert_close(np.asarray(ours.scores), hf_scores)


def _an_eos_ending_beams_early(family, beams):
    """An id with which HF's beam search on `_inputs` ends every beam of one row early and cuts
    other beams at NEW tokens, its beams apart by more than float noise. Searched on the model
    itself, as the random init behind it differs between transformers versions; the ids its beams
    emit most often come first."""
    emitted, _ = _hf_beams(family, family[1].config.eos_token_id, beams)
    ids, counts = np.unique(emitted[emitted >= 2], return_counts=True)
    for eos in ids[np.argsort(-counts, kind="stable")]:
        expected, hf_scores = _hf_beams(family, eos, beams)
        ended = (expected == eos).any(-1)
        if ended.all(1).any() and not ended.all() and np.diff(-hf_scores, axis=1).min() > 1e-3:
            return int(eos)
    pytest.fail("no EOS id ends one row's beams early and cuts others at the maximum length")


def test_beam_search_with_beams_ending_early_is_hf_beam_search(family):
    """Rows of different input lengths whose beams end at different steps, one row's all before the
    last step (its finished set fills and stops taking hypotheses early, as HF's early-stop check
    does), others cut at the maximum length: HF's beams, order and scores."""
    ours, expected, hf_scores = _beams_and_hf_beams(family, _an_eos_ending_beams_early(family, beams=4), beams=4)
    np.testing.assert_array_equal(np.asarray(ours.tokens), expected)
    assert_close(np.asarray(ours.scores), hf_scores)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 0.9), (0.7, 10, 0.0), (1.3, 8, 0.6), (0.5, 3, 0.95),
                                                       (2.0, 30, 0.3)])
def test_sampling_filters_are_hf_logits_warpers(temperature, top_k, top_p):
    """Temperature, then top-k, then top-p on the renormalised top-k: the same kept tokens and
    the same sampling distribution as HF's warpers applied in generate's order."""
    logits = np.random.RandomState(7).normal(0.0, 2.0, (6, 50)).astype(np.float32)
    warpers = [transformers.TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(transformers.TopKLogitsWarper(top_k))
    if top_p:
        warpers.append(transformers.TopPLogitsWarper(top_p))
    expected = torch.tensor(logits)
    for warper in warpers:
        expected = warper(None, expected)
    ours = np.asarray(decoding.filter_logits(jnp.asarray(logits) / temperature, top_k, top_p))
    np.testing.assert_array_equal(ours > decoding.NEG_INF / 2, torch.isfinite(expected).numpy())
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(ours)), expected.softmax(-1).numpy(), atol=1e-6)


def test_special_ids_are_imported_and_written_back(family, tmp_path):
    """Start, EOS and pad ids come from HF's config (T5 0/1/0, BART 2/2/1, GPT-2 BOS = EOS = the
    last id) and survive a save."""
    name, model, module, params = family
    gen = model.generation_config
    start = gen.bos_token_id if name == "gpt2" else gen.decoder_start_token_id
    cfg = module.config
    assert (cfg.decoder_start_token_id, cfg.eos_token_id) == (start, gen.eos_token_id)
    assert cfg.pad_token_id == (gen.pad_token_id or 0)
    assert {"t5": (0, 1, 0), "bart": (2, 2, 1), "gpt2": (V - 1, V - 1, 0)}[name] == \
        (cfg.decoder_start_token_id, cfg.eos_token_id, cfg.pad_token_id)
    saved, _ = hf.load(hf.save(module, {"params": params}, str(tmp_path / "out")))
    assert (saved.config.decoder_start_token_id, saved.config.eos_token_id, saved.config.pad_token_id) == \
        (cfg.decoder_start_token_id, cfg.eos_token_id, cfg.pad_token_id)


def _full_length_inputs(name, config):
    """`_inputs`, but GPT-2's prompts all full length: HF penalizes a repeat of its left padding too."""
    if name != "gpt2":
        return _inputs(name, config)[:2]
    prompt = np.random.RandomState(5).randint(0, V - 1, (3, 7))
    return ({"decoder_prompt_tokens": jnp.asarray(prompt)},
            dict(input_ids=torch.tensor(prompt), attention_mask=torch.ones(prompt.shape, dtype=torch.long)))


@pytest.mark.parametrize("penalty", [1.2, 3.0])
def test_repetition_penalty_is_hf_generates(family, penalty):
    """Greedy decoding with CTRL's repetition penalty gives HF generate's tokens with
    `repetition_penalty`: the prompt (decoder-only) or the start token (encoder-decoder) and every
    generated token penalized, as `RepetitionPenaltyLogitsProcessor` does; the penalty changes them."""
    name, model, module, params = family
    ours_in, hf_in = _full_length_inputs(name, module.config)
    eos = model.config.eos_token_id
    _, hf_tokens = _generate(model, hf_in, eos, do_sample=False, num_beams=1, repetition_penalty=penalty)
    expected = _padded(hf_tokens, eos, module.config.pad_token_id)
    ours = decoding.greedy(module, params, ours_in, max_decode_length=NEW, repetition_penalty=penalty)
    np.testing.assert_array_equal(np.asarray(ours.tokens), expected)
    plain = decoding.greedy(module, params, ours_in, max_decode_length=NEW)
    if penalty == 3.0:
        assert (np.asarray(plain.tokens) != expected).any(), "the penalty should change some tokens"


def test_penalized_logits_are_hf_repetition_penalty_processor():
    """`penalize_repetition` on logits of both signs: HF's processor, given each row's earlier ids."""
    rng = np.random.RandomState(11)
    logits = rng.normal(0.0, 3.0, (4, 50)).astype(np.float32)
    ids = rng.randint(0, 50, (4, 9))
    expected = transformers.RepetitionPenaltyLogitsProcessor(1.2)(torch.tensor(ids), torch.tensor(logits)).numpy()
    seen = decoding.tokens_seen(jnp.asarray(ids), jnp.full(4, 9), 50)
    assert_close(np.asarray(decoding.penalize_repetition(jnp.asarray(logits), seen, 1.2)), expected)
    assert (expected != logits).any() and (logits[np.asarray(seen)] < 0).any()
