"""The TPU VM scripts, run with a fake `gcloud` first on PATH that records each call: what they
call (or print with --dry-run), and that --help, a wrong option or an unconfirmed teardown calls
nothing (a real gcloud would start a billed slice or delete one)."""
import os
import pty
import shlex
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "tpu_scripts"
ALL_SCRIPTS = sorted(p.name for p in SCRIPTS.glob("*.sh") if p.name != "common.sh")
SETTINGS = {"PROJECT": "my-proj", "TPU_NAME": "pod", "ZONE": "us-east5-a", "ACCELERATOR_TYPE": "v5p-32"}
FAKE_GCLOUD = """#!/usr/bin/env bash
printf '%q ' "$@" >> "$GCLOUD_CALLS"; echo >> "$GCLOUD_CALLS"
if [[ "$*" == "config get-value project" ]]; then echo configured-proj; fi
"""
RUN_FLAGS = ("--gin_file=configs/tpu/t5_1_1_base_c4_pretrain.gin", "--gin.MODEL_DIR='gs://b/r'")


@pytest.fixture
def gcloud(tmp_path):
    """Runs a script as `gcloud(script, *args, stdin=..., settings=...)` with the fake gcloud;
    returns the finished process and the argv of each gcloud call it made."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(FAKE_GCLOUD)
    (bin_dir / "gcloud").chmod(0o755)
    calls = tmp_path / "gcloud_calls"

    def run(script, *args, stdin=subprocess.DEVNULL, settings=SETTINGS):
        calls.write_text("")
        env = {**{k: v for k, v in os.environ.items() if k not in SETTINGS and k != "DRY_RUN"}, **settings,
               "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GCLOUD_CALLS": str(calls)}
        out = subprocess.run(["bash", str(SCRIPTS / script), *args], env=env, stdin=stdin, capture_output=True,
                             text=True, timeout=60)
        return out, [shlex.split(line) for line in calls.read_text().splitlines()]
    return run


def _dry_run(gcloud, script, *args):
    out, calls = gcloud(script, "--dry-run", *args)
    assert out.returncode == 0 and calls == [], out.stderr
    return out.stdout


def test_create_and_teardown_dry_run(gcloud):
    create = _dry_run(gcloud, "create.sh")
    assert create.startswith("gcloud compute tpus tpu-vm create pod --zone=us-east5-a --project=my-proj")
    assert "--accelerator-type=v5p-32" in create
    assert _dry_run(gcloud, "teardown.sh").startswith("gcloud compute tpus tpu-vm delete pod")


def test_setup_installs_on_every_worker(gcloud):
    out = _dry_run(gcloud, "setup.sh")
    assert "--worker=all" in out and "jax\\[tpu\\]" in out
    assert "tfds\\,gcs" in out  # gs:// MODEL_DIRs need gcsfs where TensorFlow is not installed


def test_run_passes_gin_flags_to_every_worker(gcloud):
    out = _dry_run(gcloud, "run.sh", *RUN_FLAGS)
    assert "--worker=all" in out and "t5lite\\ train" in out and "t5_1_1_base_c4_pretrain.gin" in out
    assert "T5LITE_DISTRIBUTED=1" in out


@pytest.mark.parametrize("script", ALL_SCRIPTS)
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_usage_and_calls_no_gcloud(gcloud, script, flag):
    """Not even gcloud's configured project is read (PROJECT unset)."""
    out, calls = gcloud(script, *RUN_FLAGS, flag, settings={})
    assert out.returncode == 0 and calls == [], out.stderr
    assert out.stdout.startswith(f"usage: tpu_scripts/{script} [--dry-run]")
    assert "-h, --help" in out.stdout and "TPU_NAME" in out.stdout and out.stderr == ""


@pytest.mark.parametrize("script", ALL_SCRIPTS)
@pytest.mark.parametrize("arg", ["--zone=x", "pod"])
def test_unknown_options_are_refused_in_one_line(gcloud, script, arg):
    out, calls = gcloud(script, arg, *RUN_FLAGS[:1] if script == "run.sh" else ())
    assert out.returncode == 2 and calls == [] and out.stdout == ""
    assert out.stderr.splitlines() == [f"{script}: unknown option '{arg}'; see {SCRIPTS / script} --help"]


def test_run_without_flags_prints_usage(gcloud):
    out, calls = gcloud("run.sh", "--dry-run")
    assert out.returncode == 2 and calls == [] and len(out.stderr.splitlines()) == 1
    assert "no t5lite train flags; usage:" in out.stderr


def test_teardown_without_yes_and_no_terminal_refuses(gcloud):
    out, calls = gcloud("teardown.sh")
    assert out.returncode == 2 and calls == []
    assert out.stderr.splitlines() == ["teardown.sh: deleting TPU VM pod needs confirmation and stdin is not a "
                                       "terminal; rerun with --yes"]


def _on_terminal(gcloud, answer):
    """teardown.sh with a terminal as stdin, on which `answer` has been typed."""
    leader, follower = pty.openpty()
    try:
        os.write(leader, f"{answer}\n".encode())
        return gcloud("teardown.sh", stdin=follower)
    finally:
        os.close(follower)
        os.close(leader)


DELETE = ["compute", "tpus", "tpu-vm", "delete", "pod", "--zone=us-east5-a", "--project=my-proj", "--quiet"]


@pytest.mark.parametrize("answer,deleted", [("y", True), ("yes", True), ("n", False), ("", False)])
def test_teardown_asks_on_a_terminal(gcloud, answer, deleted):
    out, calls = _on_terminal(gcloud, answer)
    assert "Delete TPU VM pod in us-east5-a (project my-proj)? [y/N]" in out.stderr
    assert (out.returncode, calls) == ((0, [DELETE]) if deleted else (1, []))


def test_teardown_with_yes_deletes(gcloud):
    out, calls = gcloud("teardown.sh", "--yes")
    assert out.returncode == 0 and calls == [DELETE], out.stderr


def test_create_setup_and_run_call_gcloud_for_the_configured_project(gcloud):
    """PROJECT unset: gcloud's configured project, read once per script."""
    settings = {k: v for k, v in SETTINGS.items() if k != "PROJECT"}
    where = ["--zone=us-east5-a", "--project=configured-proj"]
    config = ["config", "get-value", "project"]
    out, calls = gcloud("create.sh", settings=settings)
    assert out.returncode == 0 and calls == [config, ["compute", "tpus", "tpu-vm", "create", "pod", *where,
                                                      "--accelerator-type=v5p-32", "--version=tpu-ubuntu2204-base"]]
    out, calls = gcloud("setup.sh", settings=settings)
    assert out.returncode == 0 and [call[:4] for call in calls] == [config, ["compute", "tpus", "tpu-vm", "scp"],
                                                                    ["compute", "tpus", "tpu-vm", "ssh"]]
    assert calls[1][4:6] == ["--recurse", str(SCRIPTS.parent)] and calls[1][6:] == ["pod:~/t5lite", *where,
                                                                                    "--worker=all"]
    assert calls[2][4:8] == ["pod", *where, "--worker=all"] and "'jax[tpu]'" in calls[2][8]
    out, calls = gcloud("run.sh", *RUN_FLAGS, "--prune_heads=0.25", settings=settings)
    assert out.returncode == 0 and calls[0] == config and calls[1][:8] == ["compute", "tpus", "tpu-vm", "ssh", "pod",
                                                                           *where, "--worker=all"]
    command = calls[1][8].removeprefix("--command=")
    train = command.split(" train ")[1].split(" 2>&1")[0]
    assert command.startswith("cd t5lite && T5LITE_DISTRIBUTED=1 .venv/bin/t5lite train ")
    assert shlex.split(train) == [*RUN_FLAGS, "--prune_heads=0.25"]
