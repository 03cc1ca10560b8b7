"""T5X's Adafactor: factoring by logical axes against a numpy re-derivation, against optax on
matrices, and a scanned stack trained like the same layers unscanned (per-layer statistics)."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from t5lite.data import get_task
from t5lite.data.loader import Loader
from t5lite.models import get_config
from t5lite.train import adafactor as A
from t5lite.train import optimizers
from t5lite.train.partitioning import Partitioner
from t5lite.train.step import TrainTask

LR, EPS1, EPS2, CLIP, DECAY = 0.3, 1e-30, 1e-3, 1.0, 0.8


def numpy_adafactor(param, grads, rows, cols, batch=()):
    """Adafactor (Shazeer & Stern 2018, T5X's settings) for one parameter, one update per gradient.

    The second moment of g**2 + eps1 is kept as a row statistic (mean over `cols`) and a column
    statistic (mean over `rows`), separately for every index of the `batch` dims; the update is
    clipped to RMS 1 and scaled by the parameter's RMS, both over the non-batch dims."""
    param = param.astype(np.float64)
    others = tuple(i for i in range(param.ndim) if i not in batch)
    v_row = v_col = 0.0
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64)
        beta2 = 1.0 - t ** -DECAY
        g2 = g * g + EPS1
        v_row = beta2 * v_row + (1 - beta2) * g2.mean(axis=cols, keepdims=True)
        v_col = beta2 * v_col + (1 - beta2) * g2.mean(axis=rows, keepdims=True)
        v_hat = v_row * v_col / v_row.mean(axis=rows, keepdims=True)
        y = g / np.sqrt(v_hat)
        y = y / np.maximum(1.0, np.sqrt((y * y).mean(axis=others, keepdims=True)) / CLIP)
        scale = np.maximum(np.sqrt((param * param).mean(axis=others, keepdims=True)), EPS2)
        param = param - LR * scale * y
    return param


def run(params, specs, grads, **kwargs):
    tx = A.adafactor(LR, specs, **kwargs)
    state, update = tx.init(params), jax.jit(tx.update)
    for g in grads:
        updates, state = update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


@pytest.mark.parametrize("axes, shape, rows, cols, batch", [
    (("embed", "heads", "kv"), (16, 4, 8), (0,), (1, 2), ()),       # factored although below 128
    (("heads", "kv", "embed"), (4, 8, 16), (2,), (0, 1), ()),
    (("layers", "embed", "mlp"), (3, 16, 24), (1,), (2,), (0,)),    # per layer
    (("layers", "embed", "heads", "kv"), (2, 8, 2, 4), (1,), (2, 3), (0,)),
])
def test_update_matches_numpy_rederivation(axes, shape, rows, cols, batch):
    rng = np.random.default_rng(0)
    # Layers of very different scales: a stack-wide clip or parameter scale would be visible.
    magnitude = np.geomspace(0.01, 10.0, shape[0]).reshape((-1,) + (1,) * (len(shape) - 1)) if batch else 1.0
    param = (rng.normal(size=shape) * magnitude).astype(np.float32)
    grads = [(rng.normal(size=shape) * magnitude).astype(np.float32) for _ in range(3)]
    out, _ = run({"w": jnp.asarray(param)}, {"w": P(*axes)}, [{"w": jnp.asarray(g)} for g in grads])
    expected = numpy_adafactor(param, grads, rows, cols, batch)
    # The change per layer, in units of the layer's scale (float32 rounding of the params aside).
    np.testing.assert_allclose((np.asarray(out["w"]) - param) / magnitude, (expected - param) / magnitude,
                               rtol=1e-4, atol=1e-5)


def test_matrices_and_vectors_follow_optax_adafactor():
    """Rank <= 2 without a layers axis: T5X's classic rule, which optax implements."""
    rng = np.random.default_rng(1)
    shapes = {"big": ((256, 128), P("vocab", "embed")), "small": ((64, 100), P("embed", "mlp")),
              "tall": ((130, 300), P("mlp", "embed")), "norm": ((200,), P("embed",))}
    params = {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, (s, _) in shapes.items()}
    specs = {k: spec for k, (_, spec) in shapes.items()}
    grads = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params) for _ in range(3)]
    ours, state = run(params, specs, grads)
    reference = optax.adafactor(LR, min_dim_size_to_factor=128, decay_rate=DECAY, clipping_threshold=CLIP,
                                multiply_by_parameter_scale=True, eps=EPS1)
    ref_params, ref_state = params, reference.init(params)
    for g in grads:
        updates, ref_state = reference.update(g, ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, updates)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6),
                 ours, ref_params)
    assert state.v["small"].shape == (64, 100) and state.v["norm"].shape == (200,)   # below 128: unfactored
    assert state.v_row["big"].shape == (1, 128) and state.v_col["big"].shape == (256, 1)


def test_unnamed_or_partial_factoring_fails_clearly():
    with pytest.raises(ValueError, match="'foo'.*factor_rules"):
        A.adafactor(LR, {"w": P("embed", "foo", "mlp")}).init({"w": jnp.zeros((2, 3, 4))})
    with pytest.raises(ValueError, match="mixes ROW, COLUMN and NONE"):
        A.adafactor(LR, {"w": P("embed", "relpos_buckets", "mlp")}).init({"w": jnp.zeros((2, 3, 4))})
    tx = A.adafactor(LR, {"w": P("embed", "foo", "mlp")}, factor_rules={"foo": "column"})
    assert tx.init({"w": jnp.zeros((2, 3, 4))}).v_row["w"].shape == (2, 1, 1)


LENGTHS = {"inputs": 16, "targets": 8}


def _trainer(config, partitioner=None):
    schedule = optimizers.rsqrt_decay()   # T5's 0.01
    lengths = Loader(get_task("embedded_docs_span_corruption"), "train", LENGTHS, 4).converter.model_feature_lengths(
        LENGTHS, pack=True)
    return TrainTask(config, optimizers.adafactor(schedule), schedule, partitioner or Partitioner(), lengths)


def _stacked(params, num_layers):
    """The looped layers `layers_i` of each stack as one scanned `layers` subtree (layer axis 0)."""
    out = {}
    for name, sub in params.items():
        if isinstance(sub, dict) and "layers_0" in sub:
            rest = {k: v for k, v in sub.items() if not k.startswith("layers_")}
            rest["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[sub[f"layers_{i}"] for i in range(num_layers)])
            out[name] = rest
        else:
            out[name] = sub
    return out


def test_scanned_stack_trains_like_the_same_layers_unscanned():
    # d_model and d_ff >= 128 so that the unscanned kernels are factored too.
    config = get_config("t5_1_1_tiny", d_model=128, num_heads=2, head_dim=64, d_ff=256, num_encoder_layers=2,
                        num_decoder_layers=2, vocab_size=2176, dropout_rate=0.0)
    looped, scanned = _trainer(config), _trainer(config.replace(scan_layers=True))
    batches = list(zip(range(3), Loader(get_task("embedded_docs_span_corruption"), "train", LENGTHS, 4)))
    state = looped.init_state(seed=0)
    scanned_state = scanned.init_state(seed=0, params=_stacked(state.params, 2))
    for trainer in (looped, scanned):
        step = trainer.jit_train_step()
        with trainer.mesh_context():
            for _, batch in batches:
                if trainer is looped:
                    state, _ = step(state, trainer.partitioner.shard_batch(batch))
                else:
                    scanned_state, _ = step(scanned_state, trainer.partitioner.shard_batch(batch))
    moved = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(),
                         _stacked(jax.device_get(state.params), 2), jax.device_get(scanned_state.params))
    assert max(jax.tree.leaves(moved)) < 1e-6
    # ...and both moved away from the start: the comparison is not between untrained params.
    start = _stacked(looped.init_state(seed=0).params, 2)
    assert max(jax.tree.leaves(jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(), start,
                                            scanned_state.params))) > 1e-3


def test_factored_statistics_are_sharded_like_the_dimensions_they_keep():
    config = get_config("t5_1_1_tiny", d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=1,
                        num_decoder_layers=1, vocab_size=2176, scan_layers=True)
    trainer = _trainer(config)
    opt = trainer.state_shardings.opt_state
    wi = ("encoder", "layers", "mlp", "wi_0", "kernel")   # (layers, embed, mlp) -> (None, fsdp, model)

    def at(tree):
        for k in wi:
            tree = tree[k]
        return tree.spec
    assert at(trainer.state_shardings.params) == P(None, "fsdp", "model")
    assert at(opt.v_row) == P(None, "fsdp", None) and at(opt.v_col) == P(None, None, "model")
    assert at(opt.v) == P()


EIGHT_DEVICES = """
import os, sys
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
import jax
sys.path.insert(0, sys.argv[1])
from test_adafactor import _trainer
from t5lite.data import get_task
from t5lite.data.loader import Loader
from t5lite.models import get_config
from t5lite.train.partitioning import Partitioner
config = get_config("t5_1_1_tiny", d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=1,
                    num_decoder_layers=1, vocab_size=2176, scan_layers=True)
trainer = _trainer(config, Partitioner((2, 2, 2)))
state = trainer.init_state(seed=0)
with trainer.mesh_context():
    batch = next(iter(Loader(get_task("embedded_docs_span_corruption"), "train", {"inputs": 16, "targets": 8}, 4)))
    state, _ = trainer.jit_train_step()(state, trainer.partitioner.shard_batch(batch))
wi = lambda t: t["encoder"]["layers"]["mlp"]["wi_0"]["kernel"]
print(repr((tuple(wi(state.opt_state.v_row).sharding.spec), tuple(wi(state.opt_state.v_col).sharding.spec),
            len(wi(state.opt_state.v_row).sharding.device_set))))
"""


def test_factored_statistics_are_placed_on_an_8_device_mesh():
    """A (2, 2, 2) mesh of fake CPU devices: the stats are laid out and a step runs."""
    tests = Path(__file__).resolve().parent
    run = subprocess.run([sys.executable, "-c", EIGHT_DEVICES, str(tests)], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(tests.parent)})
    assert run.returncode == 0, run.stderr[-3000:]
    v_row, v_col, num_devices = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    assert v_row == (None, "fsdp", None) and v_col == (None, None, "model") and num_devices == 8
