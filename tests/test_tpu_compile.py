"""`t5lite compile`: meshes over ICI/DCN, the HLO collective parser, and compiling the train step
for a TPU topology from this CPU (needs libtpu, the `tpu` extra; skipped without it)."""
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import FAST_COMPILE_FLAG

from t5lite.errors import ConfigError
from t5lite.train import tpu_compile

GIB = 2**30

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu not installed (pip install 't5lite[tpu]')")
TINY_FLAGS = ["--gin.model_config.preset='t5_1_1_tiny'", "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}",
              "--gin.BATCH_SIZE=8"]
CONFIG = "--gin_file=configs/tpu/t5_1_1_base_c4_pretrain.gin"


def tpu_env() -> dict:
    """This environment without the suite's -O0 (conftest.py): TPU programs compile as users compile them."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    flags = env.pop("XLA_FLAGS", "").replace(FAST_COMPILE_FLAG, "").strip()
    return {**env, "XLA_FLAGS": flags} if flags else env   # XLA reads a blank value as a file name


def run_python(code: str, env_extra=None) -> dict:
    env = {**tpu_env(), **(env_extra or {})}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "t5lite.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env=tpu_env(), timeout=900)


def test_collectives_are_counted_with_their_result_bytes():
    hlo = """
      %all-gather.1 = bf16[1024,512]{1,0} all-gather(bf16[256,512]{1,0} %p), dimensions={0}
      %ag-start = (f32[8,4]{1,0}, f32[32,4]{1,0}) all-gather-start(f32[8,4]{1,0} %q), dimensions={0}
      %ag-done = f32[32,4]{1,0} all-gather-done((f32[8,4]{1,0}, f32[32,4]{1,0}) %ag-start)
      %all-reduce.7 = (f32[10]{0}, s32[]) all-reduce(f32[10]{0} %a, s32[] %b), to_apply=%sum
      %reduce-scatter = f32[16,8]{1,0} reduce-scatter(f32[64,8]{1,0} %g), dimensions={0}
      %cp = (bf16[4]{0}, bf16[4]{0}, u32[], u32[]) collective-permute-start(bf16[4]{0} %x), source_target_pairs={{0,1}}
    """
    found = tpu_compile.collectives(hlo)
    assert found["all-gather"] == (2, 1024 * 512 * 2 + 32 * 4 * 4)   # the -done is not a second op
    assert found["all-reduce"] == (1, 10 * 4 + 4)
    assert found["reduce-scatter"] == (1, 16 * 8 * 4)
    assert found["collective-permute"] == (1, 4 * 2)
    assert found["all-to-all"] == (0, 0)


def test_mesh_from_create_device_mesh_on_simulated_cpu_devices():
    result = run_python("""
        import os, json
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        import jax
        from t5lite.train.partitioning import Partitioner
        p = Partitioner((2, -1, 2))
        print(json.dumps({"shape": dict(p.mesh.shape), "ids": sorted(d.id for d in p.mesh.devices.flat)}))
    """)
    assert result == {"shape": {"data": 2, "fsdp": 2, "model": 2}, "ids": list(range(8))}


def test_bad_slice_options_are_refused_naming_them():
    from t5lite.train.partitioning import Partitioner
    import jax
    with pytest.raises(ValueError, match="num_slices=2"):
        Partitioner(devices=jax.devices()[:1], num_slices=2)


@needs_libtpu
def test_compile_reports_memory_flops_and_collectives_for_a_tpu_topology():
    """Parameter bytes per device are the model's float32 bytes over the 4-way FSDP mesh; the
    compiler's FLOPs (unscanned layers, counted fully) are within 1-2x of t5lite's analytic count."""
    out = run_cli("compile", CONFIG, "--topology=v5e:2x2", *TINY_FLAGS, "--gin.model_config.scan_layers=False")
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    text = out.stdout
    assert "mesh {'data': 1, 'fsdp': 4, 'model': 1} (4 devices), HBM 16.00 GiB" in text
    assert "fits: yes" in text and "compile time:" in text
    assert "all-gather" in text   # FSDP gathers the parameters
    compiled, model = map(float, text.split("FLOPs/step: compiled ")[1].split(" (")[0].split(", model "))
    assert 1.0 <= compiled / model <= 2.0


@needs_libtpu
def test_slices_put_data_over_dcn_and_compile_from_python_gives_per_device_param_bytes():
    """One libtpu process: the 2-slice mesh layout, then a train step compiled for v5e:2x2."""
    result = run_python("""
        import json, jax
        from t5lite.models import get_config
        from t5lite.train import optimizers
        from t5lite.train.partitioning import Partitioner
        from t5lite.train.tpu_compile import compile_train_step, topology_devices, hbm_bytes
        p = Partitioner((1, -1, 1), devices=topology_devices("v5e:2x2", num_slices=2), num_slices=2)
        layout = {"shape": dict(p.mesh.shape), "slices": [[d.slice_index for d in row.flat] for row in p.mesh.devices],
                  "v4_2x2x1": len(topology_devices("v4:2x2x1"))}
        cfg = get_config("t5_1_1_tiny", d_model=64, num_heads=2, head_dim=32, d_ff=128, num_encoder_layers=1,
                         num_decoder_layers=1, vocab_size=2048)
        schedule = optimizers.rsqrt_decay()
        report = compile_train_step(cfg, optimizers.adafactor(schedule), schedule,
                                    Partitioner((1, -1, 1), devices=topology_devices("v5e:2x2")),
                                    {"inputs": 64, "targets": 16}, 8, hbm_bytes("v5e:2x2"))
        print(json.dumps({"layout": layout, "params": report.params_bytes, "fits": report.fits,
                          "temp": report.temp_bytes, "total": report.total_bytes}))
    """)
    layout = result["layout"]
    assert layout["shape"] == {"data": 2, "fsdp": 4, "model": 1}
    assert layout["v4_2x2x1"] == 4    # one device per chip (megacore), as JAX shows a v4-8
    assert layout["slices"] == [[0] * 4, [1] * 4]   # each data row is one whole slice
    # Every parameter of this model has a dimension of 64 (embed) that FSDP splits 4 ways, except
    # the relative-position tables [32 buckets, heads] (replicated): count them independently.
    d, h, hd, ff, v, buckets = 64, 2, 32, 128, 2048, 32
    attention = 4 * d * h * hd
    mlp = 3 * d * ff
    encoder = attention + mlp + 2 * d
    decoder = 2 * attention + mlp + 3 * d
    sharded = v * d + encoder + d + decoder + d + v * d        # embedding, layers, final norms, lm head
    replicated = 2 * buckets * h
    assert result["params"] == 4 * (sharded // 4 + replicated)
    assert result["fits"] and result["temp"] > 0 and result["total"] >= result["params"]


@needs_libtpu
def test_too_large_config_exits_2_naming_the_knobs():
    out = run_cli("compile", CONFIG, "--topology=v5e:2x2", "--gin.model_config.preset='t5_1_1_tiny'",
                  "--gin.BATCH_SIZE=256")
    assert out.returncode == 2, out.stdout + out.stderr[-3000:]
    assert "fits: NO" in out.stdout
    assert "TPU compiler refused" in out.stdout or "total" in out.stdout
    for knob in ("Partitioner.mesh_shape", "remat_policy", "num_microbatches", "BATCH_SIZE"):
        assert knob in out.stdout


def test_unknown_topology_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown TPU generation"):
        tpu_compile.hbm_bytes("v9x:2x2")
    assert tpu_compile.hbm_bytes("v5e:4x4") == 16 * 2**30 and math.isclose(tpu_compile.hbm_bytes("v5p:2x2x1"),
                                                                          95 * 2**30)


@needs_libtpu
def test_train_step_compiles_for_two_slices_with_data_over_dcn_and_the_gin_mesh_shape():
    """The whole step for 2 x v5e:2x2: data parallel across the slices (DCN), the gin mesh shape
    (FSDP x model, which this 1-device host could not hold) within each; the gradients are then
    reduced across slices, which shows as a reduction collective."""
    out = run_cli("compile", CONFIG, "--topology=v5e:2x2", "--num_slices=2", *TINY_FLAGS,
                  "--gin.Partitioner.mesh_shape=(1, 2, 2)")
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "mesh {'data': 2, 'fsdp': 2, 'model': 2} (8 devices)" in out.stdout
    assert "fits: yes" in out.stdout
    moved = out.stdout.split("collectives per step: ")[1].splitlines()[0]
    assert "all-gather" in moved and ("all-reduce" in moved or "reduce-scatter" in moved)


TINY_GPT2 = ["--gin_file=gin/models/t5_1_1_tiny.gin", "--gin.model_config.preset='gpt2_tiny'"]


@needs_libtpu
@pytest.mark.parametrize("preset,arch_flags", [("t5_1_1_tiny", []), ("gpt2_tiny", ["--gin.infer.method='beam'"])])
def test_decode_compiles_for_a_tpu_topology(preset, arch_flags):
    """`--mode=infer` compiles infer's decoding (prefill + loop) for encoder-decoders and
    decoder-only models; with the default data-parallel mesh every device holds all the float32
    parameters (4 bytes each, counted by the model itself)."""
    from t5lite import models
    from t5lite.infer.predict import abstract_params
    num_params = sum(math.prod(x.shape) for x in __import__("jax").tree.leaves(
        abstract_params(models.get_config(preset))))
    out = run_cli("compile", "--mode=infer", "--gin_file=gin/models/t5_1_1_tiny.gin", "--topology=v5e:2x2",
                  f"--gin.model_config.preset='{preset}'", "--gin.infer.batch_size=8",
                  "--gin.infer.max_input_length=32", "--gin.infer.max_decode_length=8", *arch_flags)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "mesh {'data': 4, 'fsdp': 1, 'model': 1} (4 devices)" in out.stdout and "fits: yes" in out.stdout
    params_gib = float(out.stdout.split("per device: params ")[1].split(" GiB")[0])
    assert params_gib == pytest.approx(4 * num_params / 2**30, abs=0.006)
    assert "decode loop" in out.stdout


@needs_libtpu
def test_decode_that_does_not_fit_exits_2():
    """16384 rows of 1024 inputs and 1024 decoded tokens (KV cache, encoder states) cannot fit a
    v5e chip's 16 GiB, even split 4 ways."""
    out = run_cli("compile", "--mode=infer", "--gin_file=gin/models/t5_1_1_tiny.gin", "--topology=v5e:2x2",
                  "--gin.infer.batch_size=16384",
                  "--gin.infer.max_input_length=1024", "--gin.infer.max_decode_length=1024")
    assert out.returncode == 2, out.stdout + out.stderr[-3000:]
    assert "fits: NO" in out.stdout and "infer.batch_size" in out.stdout


def test_accelerator_types_name_their_cloud_tpu_shapes():
    assert [tpu_compile.topology_name(t) for t in ("v4-8", "v4-32", "v5p-64", "v5p-128", "v5litepod-16", "v6e-256",
                                                   "v5e:2x4")] == \
        ["v4:2x2x1", "v4:2x2x4", "v5p:2x4x4", "v5p:4x4x4", "v5e:4x4", "v6e:16x16", "v5e:2x4"]
    with pytest.raises(ConfigError, match="v4-33: no Cloud TPU slice"):
        tpu_compile.topology_name("v4-33")


@pytest.mark.parametrize("topology,message", [
    ("v5e:0x0", "a v5e shape is v5e:AxB with whole numbers of at least 1"),   # libtpu died of SIGFPE
    ("v5e:4x-1", "a v5e shape is v5e:AxB"), ("v5e:2.5x2", "a v5e shape is v5e:AxB"), ("v5e:4x", "v5e:AxB"),
    ("v5e:2x2x1", "a v5e shape is v5e:AxB"), ("v4:2x2", "a v4 shape is v4:AxBxC"), ("v5p:2x0x4", "v5p:AxBxC"),
    ("v9x:2x2", "unknown TPU generation 'v9x'"), ("4x4", "give a shape such as v5e:4x4"),
    ("v4-0", "no Cloud TPU slice has that size"),
])
def test_malformed_topologies_are_refused_before_libtpu(topology, message):
    with pytest.raises(ConfigError, match=rf"^--topology={re.escape(topology)}: .*{re.escape(message)}"):
        tpu_compile.topology_name(topology)


def test_shapes_are_normalised_for_libtpu():
    assert [tpu_compile.topology_name(t) for t in ("V5E:4X4", "v5litepod:2x2", " v4:2x2x01 ")] == \
        ["v5e:4x4", "v5e:2x2", "v4:2x2x1"]


def test_compile_refuses_a_malformed_topology_in_one_line_without_libtpu():
    """Refused before gin is parsed and libtpu loads: no config is needed to see it, and no SIGFPE."""
    out = run_cli("compile", "--topology=v5e:0x0")
    assert out.returncode == 2, out.stdout + out.stderr[-3000:]
    error = [line for line in out.stderr.splitlines() if line.startswith("t5lite: error:")]
    assert len(error) == 1 and error[0].startswith("t5lite: error: --topology=v5e:0x0: a v5e shape is v5e:AxB with "
                                                   "whole numbers of at least 1; give a shape such as v5e:4x4")
    assert "Traceback" not in out.stderr and "compile time" not in out.stdout


@needs_libtpu
@pytest.mark.parametrize("flags,message", [
    (["--topology=v5e:4x4", "--gin.BATCH_SIZE=24"], "BATCH_SIZE=24 with 1 microbatch(es) must split evenly over the "
                                                    "16-way data-parallel mesh"),
    (["--topology=v5e:4x5"], "--topology=v5e:4x5: libtpu cannot describe"),
    (["--topology=v5e:4x4", "--gin.model_config.preset='t5_1_1_bse'"], "unknown model preset 't5_1_1_bse'"),
    # Far beyond any chip: refused from the estimate, before XLA (which aborted or ran for minutes).
    (["--topology=v5e:4x4", "--gin.BATCH_SIZE=2147483648"], "BATCH_SIZE=2147483648 (134217728 rows per device and "
                                                            "microbatch) needs at least"),
])
def test_compile_refuses_bad_plans_before_xla_in_one_line(flags, message):
    out = run_cli("compile", CONFIG, *flags)
    assert out.returncode == 2, out.stdout + out.stderr[-3000:]
    error = [line for line in out.stderr.splitlines() if line.startswith("t5lite: error:")]
    assert len(error) == 1 and message in error[0], out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "compile time" not in out.stdout


def test_memory_estimate_counts_layer_inputs_and_logits_and_refuses_over_hbm():
    """A t5_1_1_base step of 1024 rows of 512 + 114 tokens on one device keeps at least every
    layer's bf16 input and the float32 logits: counted here from the model's sizes."""
    from t5lite.models import get_config
    config = get_config("t5_1_1_base", dtype="bfloat16")
    lengths = {"encoder_input_tokens": 512, "decoder_input_tokens": 114}
    expected = 1024 * ((512 * 12 + 114 * 12) * 768 * 2 + 114 * 32128 * 4)
    assert tpu_compile.train_activation_bytes(config, lengths, 1024, 1) == expected
    sizes = dict(params_bytes=GIB, opt_state_bytes=GIB, batch_bytes=0)
    total = f"{(expected + 2 * GIB) / GIB:.2f}"
    with pytest.raises(ConfigError, match=rf"BATCH_SIZE=1024 needs at least {total} GiB per device .* more than the "
                                          r"chip's 16\.00 GiB of HBM; try the knobs"):
        tpu_compile.check_memory("BATCH_SIZE=1024", sizes, expected, 16 * GIB, "the knobs")
    tpu_compile.check_memory("BATCH_SIZE=256", sizes, expected // 4, 16 * GIB, "the knobs")


@needs_libtpu
def test_train_step_compiles_for_a_slice_of_four_hosts():
    """v5e:4x4 is 16 chips on 4 hosts whose devices the mesh interleaves (host 0 holds FSDP rows
    0, 1, 6, 15): each host reads one data shard of a quarter of the batch."""
    out = run_cli("compile", CONFIG, "--topology=v5e:4x4", *TINY_FLAGS[:2], "--gin.BATCH_SIZE=32")
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "mesh {'data': 1, 'fsdp': 16, 'model': 1} (16 devices)" in out.stdout and "fits: yes" in out.stdout
    assert "batch 32: 2 rows per device and microbatch; 4 host(s) read 4 data shard(s) of 8 rows" in out.stdout


@needs_libtpu
@pytest.mark.slow
@pytest.mark.parametrize("mode,topology,hosts", [
    ("train", ["--topology=v4-32"], 4), ("train", ["--topology=v5p-64"], 8),
    ("train", ["--topology=v5e:4x4", "--num_slices=2"], 8), ("infer", ["--topology=v4-32"], 4)])
def test_multi_host_slices_compile_for_train_and_infer(mode, topology, hosts):
    if mode == "train":
        out = run_cli("compile", CONFIG, *topology, *TINY_FLAGS[:2], "--gin.BATCH_SIZE=64")
    else:
        out = run_cli("compile", "--mode=infer", "--gin_file=gin/models/t5_1_1_tiny.gin", *topology,
                      "--gin.infer.batch_size=8", "--gin.infer.max_input_length=32", "--gin.infer.max_decode_length=8")
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "fits: yes" in out.stdout
    if mode == "train":
        assert f"{hosts} host(s) read {hosts} data shard(s)" in out.stdout
    else:   # 8 inputs filled up to one per device, as t5lite infer fills them
        assert "batch 16 (infer.batch_size=8 filled up to a multiple of the 16 data-parallel rows)" in out.stdout
