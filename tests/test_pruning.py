"""Pruning: masks equal to a numpy re-derivation of open_lth's rule (global threshold, ties) and to
`torch.nn.utils.prune` where the rule is the same; pruned weights stay zero through training and
rewinding restores the early step's kept weights; head importance equal to a torch re-derivation
of Michel et al.'s head mask on a Hugging Face BERT."""
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.infer.checkpoint_reader import restore_params
from t5lite.infer.predict import abstract_params
from t5lite.run_layout import RunDir
from t5lite.train import optimizers, pruning
from tests.conftest import assert_close, train_tiny


def _params(rng, ties=False):
    a = rng.normal(size=(6, 8)).astype(np.float32)
    b = rng.normal(size=(5, 2, 4)).astype(np.float32)
    if ties:   # an exact zero, and 4 equal magnitudes (both signs) at the 20% threshold
        a[5, 7] = 0.0
        flat = np.concatenate([a.ravel(), b.ravel()])
        order = np.argsort(np.abs(flat))                  # smallest first, the zero first
        k = math.ceil(0.2 * order.size)
        flat[order[k - 1:k + 3]] = np.sign(flat[order[k - 1:k + 3]]) * np.abs(flat[order[k]])
        a, b = flat[:a.size].reshape(a.shape), flat[a.size:].reshape(b.shape)
    return {"mlp": {"wi": {"kernel": a, "bias": np.ones(8, np.float32)}},
            "attention": {"out": {"kernel": b}}, "norm": {"scale": np.ones(4, np.float32)}}


def _open_lth(weights, fraction, current_mask=None):
    """facebookresearch/open_lth, pruning/sparse_global.py, Strategy.prune, on a list of arrays
    pruned together (current_mask None: pruning/mask.py's Mask.ones_like)."""
    current_mask = [np.ones_like(w) for w in weights] if current_mask is None else [m.astype(w.dtype) for w, m
                                                                                    in zip(weights, current_mask)]
    number_of_remaining_weights = np.sum([np.sum(v) for v in current_mask])
    number_of_weights_to_prune = np.ceil(fraction * number_of_remaining_weights).astype(int)
    weight_vector = np.concatenate([v[m == 1] for v, m in zip(weights, current_mask)])
    threshold = np.sort(np.abs(weight_vector))[number_of_weights_to_prune]
    return [np.where(np.abs(v) > threshold, m, np.zeros_like(v)).astype(bool) for v, m in zip(weights, current_mask)]


def _kernels(tree):
    return [tree["mlp"]["wi"]["kernel"], tree["attention"]["out"]["kernel"]]


@pytest.mark.parametrize("ties", [False, True])
def test_global_masks_equal_the_open_lth_rule_in_numpy(ties):
    rng = np.random.default_rng(0)
    params = _params(rng, ties)
    masks = pruning.magnitude_masks(params, 0.2, rounds=1, scope="global")
    for got, expected in zip(_kernels(masks), _open_lth(_kernels(params), 0.2)):
        np.testing.assert_array_equal(got, expected)
    kept = sum(int(m.sum()) for m in _kernels(masks))
    # ceil(0.2 n) + 1 go, the zero weight among them; with the tie, the 2 more equal to the threshold.
    assert 88 - kept == math.ceil(0.2 * 88) + 1 + 2 * ties
    # Two rounds: the second takes 20% of what the first kept (open_lth's next level, given its mask).
    twice = pruning.magnitude_masks(params, 0.2, rounds=2, scope="global")
    first = _open_lth(_kernels(params), 0.2)
    for got, expected in zip(_kernels(twice), _open_lth(_kernels(params), 0.2, first)):
        np.testing.assert_array_equal(got, expected)
    assert masks["mlp"]["wi"]["bias"].shape == () and masks["norm"]["scale"]


def test_the_first_mask_is_all_ones_and_a_later_round_continues_the_current_mask():
    """open_lth's first round counts exact zeros among the remaining weights and prunes them by
    magnitude: with 30 zeros among 88 weights, 20% (k = 18) is all zeros, so the 30 go and no
    other weight does. A round given the current mask takes 20% of what it keeps."""
    params = _params(np.random.default_rng(3))
    params["mlp"]["wi"]["kernel"][:, :5] = 0.0
    first = pruning.magnitude_masks(params, 0.2, scope="global")
    expected = _open_lth(_kernels(params), 0.2)
    for got, want in zip(_kernels(first), expected):
        np.testing.assert_array_equal(got, want)
    assert sum(int(m.sum()) for m in expected) == 88 - 30
    second = pruning.magnitude_masks(params, 0.2, scope="global", current_mask=first)
    for got, want in zip(_kernels(second), _open_lth(_kernels(params), 0.2, expected)):
        np.testing.assert_array_equal(got, want)
    assert sum(int(m.sum()) for m in _kernels(second)) == 58 - math.ceil(0.2 * 58) - 1


def test_per_layer_and_global_masks_equal_torch_prune():
    """Without ties, open_lth's rule removes the ceil(0.2 n) + 1 smallest weights, the count that
    torch's l1_unstructured / global_unstructured then remove."""
    torch = pytest.importorskip("torch", reason="torch.nn.utils.prune is the reference (extra 'hf')")
    import torch.nn.utils.prune as prune
    params = _params(np.random.default_rng(1))
    kernels = _kernels(params)
    per_layer = _kernels(pruning.magnitude_masks(params, 0.2, scope="layer"))
    for w, mask in zip(kernels, per_layer):
        module = torch.nn.Module()
        module.weight = torch.nn.Parameter(torch.from_numpy(w.copy()))
        prune.l1_unstructured(module, "weight", amount=math.ceil(0.2 * w.size) + 1)
        np.testing.assert_array_equal(mask, module.weight_mask.numpy().astype(bool))
    modules = []
    for w in kernels:
        modules.append(torch.nn.Module())
        modules[-1].weight = torch.nn.Parameter(torch.from_numpy(w.copy()))
    n = sum(w.size for w in kernels)
    prune.global_unstructured([(m, "weight") for m in modules], prune.L1Unstructured, amount=math.ceil(0.2 * n) + 1)
    for m, mask in zip(modules, _kernels(pruning.magnitude_masks(params, 0.2, scope="global"))):
        np.testing.assert_array_equal(mask, m.weight_mask.numpy().astype(bool))


def test_pruned_weights_stay_zero_through_training_and_rewinding_restores_kept_weights(tmp_path, micro_config):
    dense = tmp_path / "dense"
    train_tiny(dense, micro_config, 6, async_checkpoints=False)
    abstract = abstract_params(micro_config)
    early, final = (restore_params(str(dense / "checkpoints" / s), abstract) for s in ("3", "6"))
    expected_masks = pruning.magnitude_masks(final, 0.5, rounds=1, scope="layer")

    pruned = tmp_path / "pruned"
    train_tiny(pruned, micro_config, 3, initial_checkpoint_path=str(dense), async_checkpoints=False,
               pruning=pruning.MagnitudePruning(fraction=0.5, scope="layer"))
    after = restore_params(str(pruned), abstract)
    for path, mask in jax.tree_util.tree_leaves_with_path(expected_masks):
        w = np.asarray(_at(after, path))
        if mask.ndim:
            assert np.all(w[~mask] == 0), jax.tree_util.keystr(path)
            assert np.all(w[mask] != 0) and not np.array_equal(w[mask], np.asarray(_at(final, path))[mask])
    report = json.loads((pruned / "sparsity.json").read_text())
    assert report["total"] == pytest.approx(0.5, abs=0.01)
    assert all(s == pytest.approx(0.5, abs=0.02) for s in report["layers"].values())
    logged = [json.loads(line) for line in (pruned / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["sparsity"] == report["total"]
    assert {k[len("sparsity/"):]: v for k, v in logged[0].items() if k.startswith("sparsity/")} == report["layers"]

    # Rewinding, with a zero learning rate so the one step leaves the rewound weights as they are.
    rewound = tmp_path / "rewound"
    zero = optimizers.constant(0.0)
    train_tiny(rewound, micro_config, 1, initial_checkpoint_path=str(dense), async_checkpoints=False,
               optimizer=(optimizers.adafactor(zero), zero),
               pruning=pruning.MagnitudePruning(fraction=0.5, scope="layer",
                                                rewind_checkpoint=str(dense / "checkpoints" / "3")))
    start = restore_params(str(rewound), abstract)
    for path, mask in jax.tree_util.tree_leaves_with_path(expected_masks):
        np.testing.assert_array_equal(np.asarray(_at(start, path)), np.where(mask, np.asarray(_at(early, path)), 0))

    # A round from the pruned run continues its mask, as open_lth's next level is given the last one's.
    again = tmp_path / "again"
    train_tiny(again, micro_config, 1, initial_checkpoint_path=str(pruned), async_checkpoints=False,
               optimizer=(optimizers.adafactor(zero), zero), pruning=pruning.MagnitudePruning(fraction=0.5, scope="layer"))
    second = restore_params(str(again), abstract)
    for path, mask in jax.tree_util.tree_leaves_with_path(expected_masks):
        if mask.ndim:
            w = np.asarray(_at(after, path))
            (want,) = _open_lth([w], 0.5, [mask])
            np.testing.assert_array_equal(np.asarray(_at(second, path)), np.where(want, w, 0))
    assert json.loads((again / "sparsity.json").read_text())["total"] == pytest.approx(0.75, abs=0.01)


def _at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


def _michel_importance(torch, model, batches, normalize_scores_by_layer):
    """pmichel31415/pytorch-pretrained-BERT (branch paul), examples/classifier_eval.py,
    calculate_head_importance, on a Hugging Face BertForMaskedLM: each layer's per-head context
    (their `context_layer_val`, [batch, heads, length, head_dim], kept with retain_grad) dotted
    with its gradient, |.| per example, head and token, summed; divided by the token count (the
    last layer by the example count), then by each layer's l2 norm. Returns (sums, scores)."""
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    contexts = {}

    def keep(layer):
        def hook(mod, args, out):
            out[0].retain_grad()
            contexts[layer] = out[0]
        return hook
    hooks = [layer.attention.self.register_forward_hook(keep(i)) for i, layer in enumerate(model.bert.encoder.layer)]
    head_importance = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    tot_tokens, subset_size = 0, 0
    for batch in batches:
        logits = model(input_ids=torch.from_numpy(batch["tokens"])).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.from_numpy(batch["labels"]).reshape(-1)).sum()
        loss.backward()
        for layer in range(n_layers):
            b, length, _ = contexts[layer].shape
            ctx = contexts[layer].view(b, length, n_heads, -1).permute(0, 2, 1, 3)
            grad_ctx = contexts[layer].grad.view(b, length, n_heads, -1).permute(0, 2, 1, 3)
            dot = torch.einsum("bhli,bhli->bhl", [grad_ctx, ctx])
            head_importance[layer] += dot.abs().sum(-1).sum(0).detach().double()
        tot_tokens += batch["tokens"].size
        subset_size += len(batch["tokens"])
    for hook in hooks:
        hook.remove()
    sums = head_importance.clone().numpy()
    head_importance[:-1] /= tot_tokens
    head_importance[-1] /= subset_size
    if normalize_scores_by_layer:
        exponent = 2
        norm_by_layer = torch.pow(torch.pow(head_importance, exponent).sum(-1), 1 / exponent)
        head_importance /= norm_by_layer.unsqueeze(-1) + 1e-20
    return sums, head_importance.numpy()


def _bertology_importance(torch, model, batches):
    """Hugging Face's run_bertology.py, compute_heads_importance: a head_mask [layers, heads] (HF
    4.x's, applied here to each layer's self-attention output, as 5.x removed it), |d loss / d mask|
    of each batch, summed."""
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    head_dim = model.config.hidden_size // n_heads
    mask = torch.ones(n_layers, n_heads, requires_grad=True)
    hooks = [layer.attention.self.register_forward_hook(
        lambda mod, args, out, i=i: (out[0] * mask[i].repeat_interleave(head_dim)[None, None, :],) + tuple(out[1:]))
        for i, layer in enumerate(model.bert.encoder.layer)]
    expected = np.zeros((n_layers, n_heads))
    for batch in batches:
        logits = model(input_ids=torch.from_numpy(batch["tokens"])).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.from_numpy(batch["labels"]).reshape(-1))
        (grad,) = torch.autograd.grad(loss, mask)
        expected += grad.abs().numpy()
    for hook in hooks:
        hook.remove()
    return expected


def test_head_importance_equals_michel_et_als_code_and_run_bertology_on_hugging_faces_bert(tmp_path):
    """The default ('token') is Michel et al.'s calculate_head_importance: raw sums, and scores
    after their divisions and layer normalisation; 'batch' is run_bertology's |.| per batch.
    They differ: per batch, examples that pull a head opposite ways cancel."""
    torch = pytest.importorskip("torch", reason="the Hugging Face BERT is the reference (extra 'hf')")
    transformers = pytest.importorskip("transformers", reason="the Hugging Face BERT (extra 'hf')")
    from t5lite.interop import hf
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40)
    model = transformers.BertForMaskedLM(config).eval()
    model.save_pretrained(tmp_path)
    module, variables = hf.load(str(tmp_path))
    rng = np.random.default_rng(0)
    batches = [{"tokens": rng.integers(5, 97, (3, 10)), "labels": rng.integers(5, 97, (3, 10))} for _ in range(3)]

    def loss_fn(variables, batch):
        logits = module.apply(variables, encoder_input_tokens=batch["tokens"])[..., :97]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(logp, batch["labels"][..., None], -1))

    paths = pruning.attention_paths(variables["params"])
    assert len(paths) == 2
    sums, scores = _michel_importance(torch, model, batches, normalize_scores_by_layer=True)
    michel = pruning.head_importance(loss_fn, variables["params"], batches)
    assert_close(np.stack([michel[p] for p in paths]), sums, rtol=1e-4)
    normalized = pruning.normalized_by_layer(michel)
    assert_close(np.stack([normalized[p] for p in paths]), scores, rtol=1e-4)
    expected = _bertology_importance(torch, model, batches)
    importance = pruning.head_importance(loss_fn, variables["params"], batches, granularity="batch")
    assert_close(np.stack([importance[p] for p in paths]), expected, rtol=1e-4)
    assert np.all(sums > expected * 1.01)

    # Pruning the least important heads computes what gating them off computes.
    chosen = pruning.least_important_heads(normalized, 3)
    flat_order = sorted((scores[i, h], i, h) for i in range(2) for h in range(4))[:3]
    assert sorted((paths.index(p), h) for p, hs in chosen.items() for h in hs) == sorted((i, h) for _, i, h in flat_order)
    gates = jax.tree.map(lambda x: x, pruning.head_gates(variables["params"]))
    for path, heads in chosen.items():
        node = gates
        for key in path:
            node = node[key]
        node["heads"] = node["heads"].at[np.asarray(heads)].set(0)
    tokens = batches[0]["tokens"]
    gated = module.apply({"params": variables["params"], "head_gates": gates}, encoder_input_tokens=tokens)
    pruned = module.apply({"params": pruning.prune_heads(variables["params"], chosen)}, encoder_input_tokens=tokens)
    assert_close(pruned, gated, rtol=1e-5)


def _train_sst2(bindings):
    """`t5lite train` (in process) on configs/local/bert_tiny_finetune_sst2.gin with `bindings`."""
    import gin

    from t5lite import cli
    from t5lite.train import trainer
    from tests.conftest import REPO, shared_data_dir
    gin.clear_config()
    cli.parse_gin([str(REPO / "configs/local/bert_tiny_finetune_sst2.gin")],
                  [f"DATA_DIR = '{shared_data_dir() / 'glue'}'", "EVAL_EVERY = 0", "BATCH_SIZE = 8", *bindings],
                  entry=("train", trainer.train))
    trainer.train(progress=False)
    gin.clear_config()


def _stored(run):
    from t5lite.infer.checkpoint_reader import step_directory, step_reader
    return step_reader().restore(step_directory(run)).state["params"]


def test_magnitude_pruning_a_task_head_run_prunes_the_backbone_and_keeps_the_head(bert_tiny_sst2_run, tmp_path):
    """A classifier run pruned at learning rate 0: its backbone kernels masked by open_lth's
    global rule in numpy, the head (all of it, continued from the run) dense and unchanged."""
    from flax.traverse_util import flatten_dict
    out = str(tmp_path / "pruned")
    _train_sst2([f"MODEL_DIR = '{out}'", f"INITIAL_CHECKPOINT_PATH = '{bert_tiny_sst2_run}'", "TRAIN_STEPS = 1",
                 "warmup_cosine.peak_learning_rate = 0.0", "train.pruning = @MagnitudePruning()",
                 "MagnitudePruning.fraction = 0.5"])
    source, pruned = flatten_dict(_stored(bert_tiny_sst2_run)), flatten_dict(_stored(out))
    kernels = sorted(p for p in source if p[-1] == "kernel" and p[0] == "backbone")
    masks = _open_lth([np.asarray(source[p]) for p in kernels], 0.5)
    for path, mask in zip(kernels, masks):
        np.testing.assert_array_equal(pruned[path], np.where(mask, source[path], 0))
    for path in (p for p in source if p[0] == "head"):
        np.testing.assert_array_equal(pruned[path], source[path])
    report = json.loads(RunDir(out).sparsity.read_text())
    assert not any(name.startswith("head/") for name in report["layers"])
    assert_close(report["total"], 0.5, rtol=1e-3)


def _heads_of(params):
    """{attention path: [heads]} of a micro T5's params, by name."""
    from flax.traverse_util import flatten_dict
    flat = flatten_dict(params)
    return {p[:-2]: flat[p].shape[0] for p in flat if p[-2:] == ("out", "kernel")}


def _michel_heads(importance, fraction, normalize=True):
    """The heads to remove, in numpy: scores divided by their layer's l2 norm (Michel et al.'s code,
    Hugging Face's run_bertology.py), then the int(fraction x heads) lowest over all layers."""
    names = sorted(importance)
    scores = np.concatenate([np.asarray(importance[n]) / (np.linalg.norm(importance[n]) if normalize else 1)
                             for n in names])
    owner = [(n, h) for n in names for h in range(len(importance[n]))]
    k = max(1, int(fraction * scores.size))
    return sorted(owner[i] for i in np.argsort(scores, kind="stable")[:k])


def test_head_pruning_masks_the_least_important_heads_and_they_stay_zero(tmp_path, micro_config, monkeypatch):
    """`train.pruning = HeadPruning(0.3)` on a micro T5 (4 attention modules of 4 heads): the run
    scores heads per example and token, without dropout; the heads removed are a numpy
    re-derivation's from the run's recorded importance; after 3 training steps their weights are
    zero, so gating them off changes nothing (their outputs are zero), while the kept heads trained."""
    from flax.traverse_util import flatten_dict
    from t5lite import models
    from t5lite.models.layers import HEAD_GATES
    config = micro_config.replace(num_heads=4, head_dim=8, num_encoder_layers=2)
    dense = tmp_path / "dense"
    train_tiny(dense, config, 2, async_checkpoints=False)
    out = tmp_path / "pruned"
    calls, scored = [], pruning.head_importance
    monkeypatch.setattr(pruning, "head_importance", lambda *args: calls.append(args) or scored(*args))
    train_tiny(out, config, 3, initial_checkpoint_path=str(dense), async_checkpoints=False,
               pruning=pruning.HeadPruning(fraction=0.3, batches=2))
    record = json.loads(RunDir(out).head_pruning.read_text())["rounds"]
    assert len(record) == 1
    importance = record[0]["importance"]
    (loss_fn, params, batches, granularity), = calls
    assert granularity == "token" and len(batches) == 2 and config.dropout_rate > 0
    variables = {"params": params, HEAD_GATES: pruning.head_gates(params)}
    batch, key = batches[0]
    assert float(loss_fn(variables, (batch, key))) == float(loss_fn(variables, (batch, jax.random.fold_in(key, 1))))
    per_batch = scored(loss_fn, params, batches, "batch")
    for path, values in importance.items():
        assert_close(np.asarray(values), scored(loss_fn, params, batches)[tuple(path.split("/"))], rtol=1e-5)
        assert np.all(np.asarray(values) >= per_batch[tuple(path.split("/"))])
    assert sum(map(len, importance.values())) == 16
    expected = _michel_heads(importance, 0.3)
    assert len(expected) == 4
    assert sorted((p, h) for p, hs in record[0]["pruned"].items() for h in hs) == expected

    abstract = abstract_params(config)
    start, after = (restore_params(str(run), abstract) for run in (dense, out))
    flat, before = flatten_dict(after), flatten_dict(start)
    removed = {}
    for path, head in expected:
        p = tuple(path.split("/"))
        removed.setdefault(p, []).append(head)
        for name in ("query", "key", "value"):
            assert not np.asarray(flat[p + (name, "kernel")])[..., head, :].any()
        assert not np.asarray(flat[p + ("out", "kernel")])[head].any()
    kept = [(p, h) for p, n in _heads_of(after).items() for h in range(n) if h not in removed.get(p, [])]
    for p, h in kept:   # trained, not masked
        assert np.asarray(flat[p + ("out", "kernel")])[h].all()
        assert not np.array_equal(flat[p + ("out", "kernel")][h], before[p + ("out", "kernel")][h])

    module = models.build(config)
    tokens = jnp.asarray(np.random.default_rng(1).integers(3, 2000, (2, 10)), jnp.int32)
    features = dict(encoder_input_tokens=tokens, decoder_input_tokens=tokens)
    gates = pruning.head_gates(after)
    gates = jax.tree_util.tree_map_with_path(
        lambda path, g: g.at[np.asarray(removed.get(tuple(k.key for k in path[:-1]), []), int)].set(0.0), gates)
    plain = module.apply({"params": after}, **features)
    gated = module.apply({"params": after, HEAD_GATES: gates}, **features)
    np.testing.assert_array_equal(np.asarray(gated), np.asarray(plain))


def test_prune_heads_flag_prunes_a_task_head_run_that_eval_reports(bert_tiny_sst2_run, tmp_path, capsys):
    """`t5lite train --prune_heads 0.25` from a classifier run (bert_tiny: 2 layers x 4 heads, so 2
    heads go), at learning rate 0; `t5lite eval` loads the pruned run and reports its accuracy."""
    import gin

    from t5lite import cli
    from tests.conftest import REPO, shared_data_dir
    out = tmp_path / "pruned"
    glue = shared_data_dir() / "glue"
    gin.clear_config()
    cli.main(["train", f"--gin_file={REPO / 'configs/local/bert_tiny_finetune_sst2.gin'}", "--prune_heads", "0.25",
              f"--gin.MODEL_DIR='{out}'", f"--gin.INITIAL_CHECKPOINT_PATH='{bert_tiny_sst2_run}'",
              f"--gin.DATA_DIR='{glue}'", "--gin.TRAIN_STEPS=1", "--gin.EVAL_EVERY=0", "--gin.BATCH_SIZE=8",
              "--gin.warmup_cosine.peak_learning_rate=0.0", "--gin.HeadPruning.batches=2"])
    record = json.loads(RunDir(out).head_pruning.read_text())["rounds"][0]
    assert sum(map(len, record["pruned"].values())) == 2
    assert sorted((p, h) for p, hs in record["pruned"].items() for h in hs) == \
        _michel_heads(record["importance"], 0.25)
    assert all(p.startswith("backbone/") for p in record["pruned"])
    gin.clear_config()
    capsys.readouterr()
    cli.main(["eval", f"--gin_file={REPO / 'configs/local/bert_tiny_finetune_sst2.gin'}",
              f"--gin.CHECKPOINT_PATH='{out}'", f"--gin.DATA_DIR='{glue}'", "--gin.eval.max_examples=16"])
    gin.clear_config()
    assert "metrics: accuracy=" in capsys.readouterr().out
    line = json.loads((out / "eval" / "bert_glue_sst2.validation" / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["step"] == 1 and line["examples"] == 16 and 0 <= line["accuracy"] <= 100


def test_head_pruning_refuses_stacked_layers_and_bad_settings():
    from t5lite.errors import ConfigError
    stacked = {"encoder": {"layers": {"self_attention": {
        **{n: {"kernel": np.ones((2, 8, 4, 2), np.float32)} for n in ("query", "key", "value")},
        "out": {"kernel": np.ones((2, 4, 2, 8), np.float32)}}}}}
    with pytest.raises(ConfigError, match="scan_layers = False"):
        pruning.head_importance(lambda variables, batch: 0.0, stacked, [])
    for bad in (dict(fraction=1.0), dict(fraction=0.0), dict(rounds=0), dict(batches=0), dict(granularity="example")):
        with pytest.raises(ConfigError, match="HeadPruning"):
            pruning.HeadPruning(**bad)
    with pytest.raises(ConfigError, match="train.pruning"):
        pruning.HeadPruning().masks(stacked)
