"""A command on a machine without accelerators runs on the CPU and never wakes libtpu (whose errors
about the missing TPU would come before its own output), unless JAX_PLATFORMS asks for a platform."""
import os
import subprocess
import sys

import pytest

from t5lite import platforms

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBTPU_NOISE = ("could not determine TPU", "unexpected worker hostname", "TPU_WORKER_HOSTNAMES", "libtpu")


def test_a_cpu_command_prints_no_libtpu_errors(tmp_path):
    """One step of `t5lite train` on a tiny batch, with JAX_PLATFORMS unset as a user's shell has it
    (the suite sets it to cpu), on a machine whose accelerator check finds none (patched in the
    command's process, so the test means the same on a machine that has one)."""
    pytest.importorskip("libtpu", reason="the noise comes from libtpu (pip install 't5lite[tpu]')")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["PYTHONPATH"] = REPO
    argv = ["train", "--gin_file=configs/local/t5_tiny_pretrain.gin", f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
            "--gin.TRAIN_STEPS=1", "--gin.BATCH_SIZE=2", "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}"]
    no_accelerator = ("import sys; from t5lite import cli, platforms; "
                      "platforms.accelerator_present = lambda: False; cli.main(sys.argv[1:])")
    out = subprocess.run([sys.executable, "-c", no_accelerator, *argv],
                         capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final:" in out.stderr + out.stdout
    assert not [line for line in out.stderr.splitlines() if any(noise in line for noise in LIBTPU_NOISE)], out.stderr


def test_the_users_platforms_are_kept(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert platforms.default_platforms() is None
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setattr(platforms, "accelerator_present", lambda: False)
    assert platforms.default_platforms() == "cpu"
    monkeypatch.setattr(platforms, "accelerator_present", lambda: True)
    assert platforms.default_platforms() is None
