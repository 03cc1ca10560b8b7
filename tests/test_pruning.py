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
    if ties:   # a weight pruned already, and 4 equal magnitudes (both signs) at the 20% threshold
        a[5, 7] = 0.0
        flat = np.concatenate([a.ravel(), b.ravel()])
        order = np.argsort(np.abs(flat))[1:]              # the kept ones, smallest first
        k = math.ceil(0.2 * order.size)
        flat[order[k - 1:k + 3]] = np.sign(flat[order[k - 1:k + 3]]) * np.abs(flat[order[k]])
        a, b = flat[:a.size].reshape(a.shape), flat[a.size:].reshape(b.shape)
    return {"mlp": {"wi": {"kernel": a, "bias": np.ones(8, np.float32)}},
            "attention": {"out": {"kernel": b}}, "norm": {"scale": np.ones(4, np.float32)}}


def _open_lth(weights, fraction):
    """open_lth sparse_global's prune(), in numpy: masks for a list of arrays pruned together."""
    masks = [w != 0 for w in weights]
    remaining = sum(m.sum() for m in masks)
    k = int(np.ceil(fraction * remaining))
    vector = np.concatenate([w[m] for w, m in zip(weights, masks)])
    threshold = np.sort(np.abs(vector))[k]
    return [np.where(np.abs(w) > threshold, m, False) for w, m in zip(weights, masks)]


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
    remaining = 88 - ties
    # ceil(0.2 n) + 1 go; with the tie, the 2 more equal to the threshold go with them.
    assert remaining - kept == math.ceil(0.2 * remaining) + 1 + 2 * ties
    # Two rounds: the second takes 20% of what the first kept.
    twice = pruning.magnitude_masks(params, 0.2, rounds=2, scope="global")
    first = [np.where(m, w, 0) for w, m in zip(_kernels(params), _open_lth(_kernels(params), 0.2))]
    for got, expected in zip(_kernels(twice), _open_lth(first, 0.2)):
        np.testing.assert_array_equal(got, expected)
    assert masks["mlp"]["wi"]["bias"].shape == () and masks["norm"]["scale"]


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


def _at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


def test_head_importance_equals_a_torch_head_mask_on_hugging_faces_bert(tmp_path):
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

    # Torch: a mask per layer multiplies each head's context (HF 4.x's head_mask), |grad| summed.
    mask = torch.ones(2, 4, requires_grad=True)
    hooks = [layer.attention.self.register_forward_hook(
        lambda mod, args, out, i=i: (out[0] * mask[i].repeat_interleave(8)[None, None, :],) + tuple(out[1:]))
        for i, layer in enumerate(model.bert.encoder.layer)]
    expected = np.zeros((2, 4))
    for batch in batches:
        logits = model(input_ids=torch.from_numpy(batch["tokens"])).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 97), torch.from_numpy(batch["labels"]).reshape(-1))
        (grad,) = torch.autograd.grad(loss, mask)
        expected += grad.abs().numpy()
    for hook in hooks:
        hook.remove()

    def loss_fn(variables, batch):
        logits = module.apply(variables, encoder_input_tokens=batch["tokens"])[..., :97]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(logp, batch["labels"][..., None], -1))

    importance = pruning.head_importance(loss_fn, variables["params"], batches)
    paths = pruning.attention_paths(variables["params"])
    assert len(paths) == 2
    assert_close(np.stack([importance[p] for p in paths]), expected, rtol=1e-4)

    # Pruning the least important heads computes what gating them off computes.
    chosen = pruning.least_important_heads(importance, 3)
    flat_order = sorted((expected[i, h], i, h) for i in range(2) for h in range(4))[:3]
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


def test_importance_from_gradients_equals_the_gated_importance(micro_config):
    """d loss / d gate_h (the `head_gates` collection) equals sum(W_out[h] * d loss / d W_out[h])."""
    import flax.linen as nn

    from t5lite import models
    module = models.build(micro_config)
    rng = np.random.default_rng(0)
    batches = [{k: jnp.asarray(rng.integers(3, 2000, (2, 10)), jnp.int32)
                for k in ("encoder_input_tokens", "decoder_input_tokens")} for _ in range(2)]
    params = nn.unbox(module.init(jax.random.key(0), **batches[0]))["params"]

    def loss_fn(variables, batch):
        return jnp.mean(jax.nn.log_softmax(module.apply(variables, **batch))[..., 5])

    gated = pruning.head_importance(loss_fn, params, batches)
    grads = [jax.grad(lambda p: loss_fn({"params": p}, b))(params) for b in batches]
    ours = pruning.importance_from_gradients(params, grads)
    assert set(ours) == set(gated) and len(ours) == 3     # encoder, decoder self and cross attention
    for path in ours:
        assert_close(ours[path], gated[path], rtol=1e-4)


def _michel_heads(importance, fraction, normalize=True):
    """The heads to remove, in numpy: scores divided by their layer's l2 norm (Michel et al.'s code,
    Hugging Face's run_bertology.py), then the int(fraction x heads) lowest over all layers."""
    names = sorted(importance)
    scores = np.concatenate([np.asarray(importance[n]) / (np.linalg.norm(importance[n]) if normalize else 1)
                             for n in names])
    owner = [(n, h) for n in names for h in range(len(importance[n]))]
    k = max(1, int(fraction * scores.size))
    return sorted(owner[i] for i in np.argsort(scores, kind="stable")[:k])


def test_head_pruning_masks_the_least_important_heads_and_they_stay_zero(tmp_path, micro_config):
    """`train.pruning = HeadPruning(0.3)` on a micro T5 (4 attention modules of 4 heads):
    the heads removed are a numpy re-derivation's from the run's recorded importance; after 3
    training steps their weights are zero, so gating them off changes nothing (their outputs are
    zero), while the kept heads trained."""
    from flax.traverse_util import flatten_dict
    from t5lite import models
    from t5lite.models.layers import HEAD_GATES
    config = micro_config.replace(num_heads=4, head_dim=8, num_encoder_layers=2)
    dense = tmp_path / "dense"
    train_tiny(dense, config, 2, async_checkpoints=False)
    out = tmp_path / "pruned"
    train_tiny(out, config, 3, initial_checkpoint_path=str(dense), async_checkpoints=False,
               pruning=pruning.HeadPruning(fraction=0.3, batches=2))
    record = json.loads(RunDir(out).head_pruning.read_text())["rounds"]
    assert len(record) == 1
    importance = record[0]["importance"]
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
        pruning.importance_from_gradients(stacked, [])
    for bad in (dict(fraction=1.0), dict(fraction=0.0), dict(rounds=0), dict(batches=0)):
        with pytest.raises(ConfigError, match="HeadPruning"):
            pruning.HeadPruning(**bad)
    with pytest.raises(ConfigError, match="train.pruning"):
        pruning.HeadPruning().masks(stacked)
