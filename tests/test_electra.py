"""ELECTRA pre-training (t5lite.objectives.electra) against independent references: Hugging Face
`ElectraForMaskedLM` / `ElectraForPreTraining` losses on the same weights, sklearn's ROC AUC,
a chi-square test of the sampler against the generator's softmax, numpy for the total."""
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import models
from t5lite.objectives import electra
from t5lite.objectives.base import LossConfig, ratio_metrics
from conftest import assert_close

V, MASK = 97, 4


def _init(module, length=8):
    tokens = jnp.ones((1, length), jnp.int32)
    return nn.unbox(module.init(jax.random.key(0), encoder_input_tokens=tokens))["params"]


def _tiny_objective():
    disc = models.get_config("electra_tiny", dropout_rate=0.0)
    objective = electra.ElectraObjective("electra_tiny_generator")
    return objective, objective.build_model(disc), disc


def test_roc_auc_matches_sklearn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics", reason="needs scikit-learn")
    rng = np.random.default_rng(0)
    scores = np.round(rng.normal(size=(4, 50)), 1)            # rounded: many ties
    labels = (rng.random((4, 50)) < 0.3).astype(np.int32)
    weights = (rng.random((4, 50)) < 0.8).astype(np.float32)
    u, pairs = jax.jit(electra.roc_auc_counts)(scores, labels, weights)
    keep = weights.ravel() > 0
    want = sklearn_metrics.roc_auc_score(labels.ravel()[keep], scores.ravel()[keep])
    np.testing.assert_allclose(float(u / pairs), want, rtol=1e-6)


def test_sampling_follows_the_generator_softmax_and_never_draws_padding():
    scipy_stats = pytest.importorskip("scipy.stats", reason="needs scipy")
    logits = jnp.array([3.0, 0.5, 1.0, 0.0, -1.0, 2.0])   # id 0 (pad) would be the likeliest
    draws = 20000
    samples = electra.sample_replacements(jnp.broadcast_to(logits, (draws, 6)), jax.random.key(1), pad_id=0)
    counts = np.bincount(np.asarray(samples), minlength=6)
    assert counts[0] == 0
    probs = np.exp(np.asarray(logits[1:], np.float64))
    expected = probs / probs.sum() * draws
    assert scipy_stats.chisquare(counts[1:], expected).pvalue > 0.01
    # Control: a sampler off by a small shift is rejected, so the test has power.
    shifted = np.exp(np.asarray(logits[1:], np.float64) + np.array([0.1, 0, 0, 0, 0]))
    assert scipy_stats.chisquare(counts[1:], shifted / shifted.sum() * draws).pvalue < 0.01


def test_joint_params_share_embeddings_and_extract_standalone_networks():
    objective, module, disc = _tiny_objective()
    params = _init(module)
    assert "token_embedder" not in params["generator"]
    assert not {"position_embedder", "token_type_embedder", "embedding_norm"} & set(params["generator"]["encoder"])
    tokens = jnp.array([[5, 6, MASK, 8, 9, 0, 0, 0], [7, MASK, 3, 3, 2, 11, 12, 1]])
    joint_disc = module.apply({"params": params}, encoder_input_tokens=tokens, method="discriminate")
    alone_disc = models.build(disc).apply({"params": electra.discriminator_params(params)},
                                          encoder_input_tokens=tokens)
    np.testing.assert_array_equal(joint_disc, alone_disc)
    gen_config = electra.generator_config(objective.generator, disc)
    joint_gen = module.apply({"params": params}, encoder_input_tokens=tokens, method="generate")
    alone_gen = models.build(gen_config).apply({"params": electra.generator_params(params)},
                                               encoder_input_tokens=tokens)
    np.testing.assert_array_equal(joint_gen, alone_gen)
    # The generator's embedding gradient lands on the discriminator's (shared) table.
    generated_sum = lambda p: module.apply({"params": p}, encoder_input_tokens=tokens, method="generate").sum()
    grads = jax.jit(jax.grad(generated_sum))(params)
    assert float(jnp.abs(grads["discriminator"]["token_embedder"]["embedding"]).sum()) > 0


def test_mismatched_embedding_widths_are_refused():
    disc = models.get_config("electra_tiny")
    with pytest.raises(ValueError, match="'embedding_size': 32"):
        electra.generator_config(models.get_config("electra_tiny_generator", embedding_size=16), disc)
    with pytest.raises(ValueError, match="encoder_head='mlm'"):
        electra.generator_config(disc, disc)


def _batch(seed=0):
    """Two padded rows, about 30% of the real tokens masked (ELECTRA's generator input)."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(5, V, size=(2, 12)).astype(np.int32)
    lengths = np.array([12, 8])
    real = np.arange(12)[None] < lengths[:, None]
    targets[~real] = 0
    masked = real & (rng.random((2, 12)) < 0.3)
    masked[:, 1] = True
    inputs = np.where(masked, MASK, targets)
    types = (np.arange(12)[None] >= 6).astype(np.int32) * real
    return dict(encoder_input_tokens=inputs, encoder_target_tokens=targets, encoder_loss_weights=masked.astype(
        np.int32), token_type_ids=types), real, masked


def test_losses_equal_hugging_face_on_the_same_weights(tmp_path):
    torch = pytest.importorskip("torch", reason="needs the optional torch dependency (extras 'hf')")
    transformers = pytest.importorskip("transformers", reason="needs transformers (extras 'hf')")
    from t5lite.interop import hf
    torch.manual_seed(0)
    small = dict(vocab_size=V, embedding_size=16, num_attention_heads=4, max_position_embeddings=40)
    disc_hf = transformers.ElectraForPreTraining(transformers.ElectraConfig(
        hidden_size=32, num_hidden_layers=2, intermediate_size=64, **small)).eval()
    gen_hf = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        hidden_size=16, num_hidden_layers=1, intermediate_size=32, **small)).eval()
    gen_hf.electra.embeddings.load_state_dict(disc_hf.electra.embeddings.state_dict())   # shared, as trained
    gen_hf.generator_lm_head.weight = gen_hf.electra.embeddings.word_embeddings.weight
    disc_hf.save_pretrained(tmp_path / "d")
    gen_hf.save_pretrained(tmp_path / "g")
    disc_module, disc_vars = hf.load(str(tmp_path / "d"), dropout_rate=0.0)
    gen_module, gen_vars = hf.load(str(tmp_path / "g"), dropout_rate=0.0)
    objective = electra.ElectraObjective(gen_module.config)
    module = objective.build_model(disc_module.config)
    params = electra.joint_params(gen_vars["params"], disc_vars["params"])

    batch, real, masked = _batch()
    rng = np.random.default_rng(1)
    samples = rng.integers(5, V, size=masked.shape).astype(np.int32)
    samples[0, 1] = batch["encoder_target_tokens"][0, 1]     # a sample equal to the original is not "replaced"
    corrupted = np.where(masked, samples, batch["encoder_target_tokens"])
    replaced = (corrupted != batch["encoder_target_tokens"]).astype(np.int64)
    assert replaced.sum() == masked.sum() - 1

    loss = LossConfig(z_loss=0.0)
    gen_logits = module.apply({"params": params}, **batch, method="generate")
    objective_value, sums = objective.loss_from_samples(module, params, batch, gen_logits, jnp.asarray(samples),
                                                        jax.random.key(0), objective.normalizers(batch, loss), loss)
    metrics = ratio_metrics(sums)

    t = lambda a: torch.tensor(np.asarray(a, dtype=np.int64))
    with torch.no_grad():
        gen_out = gen_hf(input_ids=t(batch["encoder_input_tokens"]), attention_mask=t(real),
                         token_type_ids=t(batch["token_type_ids"]),
                         labels=t(np.where(masked, batch["encoder_target_tokens"], -100)))
        disc_out = disc_hf(input_ids=t(corrupted), attention_mask=t(real), token_type_ids=t(batch["token_type_ids"]),
                           labels=t(replaced))
    assert_close(metrics["mlm_loss"], gen_out.loss.item())
    assert_close(metrics["rtd_loss"], disc_out.loss.item())
    # The total, re-derived in numpy from Hugging Face's logits: mean CE + 50 x mean BCE.
    log_probs = gen_out.logits.numpy() - np.log(np.exp(gen_out.logits.numpy()).sum(-1, keepdims=True))
    ce = -np.take_along_axis(log_probs, batch["encoder_target_tokens"][..., None], -1)[..., 0][masked].mean()
    x = disc_out.logits.numpy()[real]
    y = replaced[real]
    bce = np.mean(np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x))))
    np.testing.assert_allclose(float(objective_value), ce + 50.0 * bce, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], ce + 50.0 * bce, rtol=1e-5)
    np.testing.assert_allclose(metrics["replaced_fraction"], replaced.sum() / masked.sum(), rtol=1e-6)
    np.testing.assert_allclose(metrics["rtd_accuracy"], np.mean((x > 0) == (y > 0)), rtol=1e-6)


def test_no_gradient_flows_from_the_discriminator_loss_into_the_generator():
    objective, module, _ = _tiny_objective()
    params = _init(module, 12)
    batch, _, _ = _batch()
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    loss = LossConfig(z_loss=0.0)
    normalizers = objective.normalizers(batch, loss)

    def part(name):
        return lambda p: objective.loss_and_metrics(module, p, batch, jax.random.key(3), normalizers, loss)[1][name][0]

    rtd_grads = jax.jit(jax.grad(part("rtd_loss")))(params)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(rtd_grads["generator"]))
    assert float(jnp.abs(rtd_grads["discriminator"]["discriminator_head"]["dense"]["kernel"]).max()) > 0
    mlm_grads = jax.jit(jax.grad(part("mlm_loss")))(params)
    assert float(jnp.abs(mlm_grads["generator"]["mlm_head"]["dense"]["kernel"]).max()) > 0


def test_electra_trains_logs_rtd_metrics_and_resumes_with_both_networks(tmp_path):
    from conftest import train_tiny
    from t5lite.infer import checkpoint_reader
    model = models.get_config("electra_tiny", vocab_size=2176, dropout_rate=0.0)
    objective = electra.ElectraObjective("electra_tiny_generator")
    args = dict(mixture_or_task_name="embedded_docs_electra_mlm", task_feature_lengths={"inputs": 32},
                feature_converter="encoder", objective=objective, z_loss=0.0)
    train_tiny(tmp_path, model, 4, **args)
    # Resumes from the step-4 checkpoint and evaluates the validation split at the end.
    train_tiny(tmp_path, model, 6, eval_every=2, eval_max_examples=4, **args)
    with open(tmp_path / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    *records, evaluation = records
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6] and evaluation["step"] == 6
    evaluated = {k for k in evaluation if k.startswith("eval_")}
    assert {f"eval_{k}" for k in ("mlm_loss", "mlm_accuracy", "rtd_loss", "rtd_accuracy")} <= evaluated
    assert all(np.isfinite(evaluation[k]) for k in evaluated) and "eval_rtd_auc" not in evaluated
    for r in records:
        for key in ("loss", "mlm_loss", "mlm_accuracy", "rtd_loss", "rtd_accuracy", "rtd_auc", "replaced_fraction"):
            assert np.isfinite(r[key]), (key, r)
        assert 0.0 <= r["rtd_auc"] <= 1.0 and 0.0 < r["replaced_fraction"] <= 1.0
    assert records[-1]["loss"] < records[0]["loss"]
    # The checkpoint holds both networks; the discriminator restores alone as a standalone encoder.
    abstract = jax.eval_shape(lambda: _init(models.build(model)))
    disc = checkpoint_reader.restore_params(os.path.join(tmp_path, "checkpoints"), {"discriminator": abstract})
    assert set(disc) == {"discriminator"}
    joint = objective.build_model(model)
    both = checkpoint_reader.restore_params(os.path.join(tmp_path, "checkpoints"), jax.eval_shape(lambda: _init(joint)))
    assert set(both) == {"generator", "discriminator"}
    # `t5lite convert --to_hf` exports the discriminator; Hugging Face scores tokens as the joint module does.
    torch = pytest.importorskip("torch", reason="the export check needs torch (extras 'hf')")
    transformers = pytest.importorskip("transformers", reason="the export check needs transformers (extras 'hf')")
    from t5lite.interop.checkpoint import t5lite_to_hf
    t5lite_to_hf(str(tmp_path), str(tmp_path / "hf"))
    exported = transformers.ElectraForPreTraining.from_pretrained(str(tmp_path / "hf")).eval()
    tokens = np.random.default_rng(0).integers(3, 2000, size=(2, 16))
    with torch.no_grad():
        theirs = exported(input_ids=torch.tensor(tokens)).logits.numpy()
    ours = joint.apply({"params": both}, encoder_input_tokens=jnp.asarray(tokens), method="discriminate")
    assert_close(ours, theirs)


def test_evaluation_is_the_split_mean_of_numpys_mlm_and_rtd_without_dropout(monkeypatch):
    """`eval_every` on an ELECTRA run scores the split: the generator's cross entropy and accuracy over
    every masked token, the discriminator's binary cross entropy and accuracy over every real token of
    the input its samples corrupted, both networks without dropout; the reference is numpy's over each
    row's logits. The sampler draws the generator's likeliest non-pad token here so that numpy can
    follow it (the sampler itself is tested above)."""
    import scipy.special
    from t5lite.data import catalog, converter_registry
    from t5lite.data.converters import EXAMPLES_KEY
    likeliest = lambda logits, rng, pad_id: jnp.argmax(logits.at[..., pad_id].set(-jnp.inf), -1).astype(jnp.int32)
    monkeypatch.setattr(electra, "sample_replacements", likeliest)
    task = catalog.get_task_or_mixture("embedded_docs_electra_mlm")
    lengths = {"inputs": 32}
    objective = electra.ElectraObjective("electra_tiny_generator", generator_overrides={"dropout_rate": 0.3})
    module = objective.build_model(models.get_config("electra_tiny", vocab_size=2176, dropout_rate=0.3))
    params = _init(module, 32)
    (evaluator,) = objective.evaluators(task, "validation", lengths, batch_size=2, max_examples=5).values()
    result = evaluator.evaluate(module, params)

    examples = list(task.get_dataset("validation", lengths))[:5]
    rows = list(converter_registry.get_feature_converter("encoder").convert(examples, lengths))
    apply = jax.jit(lambda features, method: module.apply({"params": params}, **features, method=method),
                    static_argnums=1)
    mlm, rtd, replaced_count, masked_count = [], [], 0, 0
    for row in rows:
        features = {k: jnp.asarray(v)[None] for k, v in row.items() if k != EXAMPLES_KEY}
        targets, masked = row["encoder_target_tokens"], row["encoder_loss_weights"] > 0
        log_p = scipy.special.log_softmax(np.asarray(apply(features, "generate")[0], np.float64), axis=-1)
        mlm += [(-log_p[i, targets[i]], log_p[i].argmax() == targets[i]) for i in np.flatnonzero(masked)]
        log_p[:, 0] = -np.inf                                         # the pad id is never drawn
        corrupted = np.where(masked, log_p.argmax(-1), targets)
        replaced = (corrupted != targets).astype(np.float64)
        x = np.asarray(apply({**features, "encoder_input_tokens": jnp.asarray(corrupted)[None]}, "discriminate")[0],
                       np.float64)
        real = targets != 0
        rtd += list(zip(np.logaddexp(0.0, x[real]) - x[real] * replaced[real], (x[real] > 0) == (replaced[real] > 0)))
        replaced_count, masked_count = replaced_count + replaced.sum(), masked_count + masked.sum()
    assert len(rows) == 5 and mlm
    expected = {"mlm_loss": np.mean([l for l, _ in mlm]), "mlm_accuracy": np.mean([h for _, h in mlm]),
                "rtd_loss": np.mean([l for l, _ in rtd]), "rtd_accuracy": np.mean([h for _, h in rtd]),
                "replaced_fraction": replaced_count / masked_count}
    assert set(result.metrics) == set(expected)
    for name, value in expected.items():
        assert_close(result.metrics[name], value, rtol=1e-5)


def test_electra_mlm_task_masks_by_electras_count_with_mask_only():
    """The task's generator input: [MASK] only where drawn, no random tokens, and per sequence as many
    draws as ELECTRA's `mask` takes (tests/test_reference_corruption.py compares it draw for draw)."""
    import itertools
    from t5lite.data import get_task
    from t5lite.data.corruption.masking import special_ids
    task = get_task("embedded_docs_electra_mlm")
    mask_id = special_ids(task.output_features["inputs"].vocabulary)["mask"]
    cap = int((0.15 + 0.005) * 64)                        # ELECTRA's configure_pretraining.py
    for ex in itertools.islice(task.get_dataset("train", {"inputs": 64}), 200):
        inputs, targets, weights = (np.asarray(ex[k]) for k in ("inputs", "targets", "targets_loss_weights"))
        assert not ((inputs != targets) & (weights == 0)).any()          # only drawn positions change
        assert ((inputs == targets) | (inputs == mask_id)).all()         # no random replacement
        assert weights.sum() == max(1, min(cap, round(len(targets) * 0.15)))


def test_mfu_counts_the_generators_training_as_well_as_the_discriminators():
    from t5lite.models import flops
    objective, module, disc = _tiny_objective()
    forward = sum(flops.forward_flops_per_example(c, 64) for c in (module.generator_config, disc))
    assert objective.train_flops_per_example(disc, {"encoder_input_tokens": 64}) == pytest.approx(3 * forward)
    assert forward > 1.1 * flops.forward_flops_per_example(disc, 64)
