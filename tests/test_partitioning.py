"""Sharding on CPU: 8 fake devices, and 2 processes joined by jax.distributed on localhost."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from t5lite.train.partitioning import DEFAULT_RULES, Partitioner

WORKER = str(Path(__file__).with_name("sharding_worker.py"))


def _run(args, timeout=600):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.Popen([sys.executable, WORKER, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait(proc, timeout=600):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]


def test_mesh_2x2x2_trains_like_one_device(tmp_path):
    out = tmp_path / "mesh.json"
    _wait(_run(["mesh", str(out)]))
    result = json.loads(out.read_text())
    # mlp kernel (embed, mlp) -> (fsdp, model) under the default rules, over all 8 devices.
    assert result["sharded_layout"] == {"wi_spec": ["fsdp", "model"], "num_devices": 8}
    np.testing.assert_allclose(result["sharded"], result["single"], rtol=2e-5)


def test_gradient_accumulation_adds_no_resharding(tmp_path):
    """Microbatches are strided over the batch, so each one is already spread over the data-parallel
    devices: the compiled step has no more all-gathers, all-to-alls or permutes with 4
    microbatches than with 1 (contiguous microbatches need them to reshard every microbatch)."""
    out = tmp_path / "collectives.json"
    _wait(_run(["collectives", str(out)]))
    result = json.loads(out.read_text())
    assert set(result) == {"(8, 1, 1)", "(4, 1, 2)"}
    for mesh_shape, counts in result.items():
        for op, once in counts["1"].items():
            assert counts["4"][op] <= once, (mesh_shape, op, counts)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one_process_fed_the_same_global_batch(tmp_path):
    from sharding_worker import host_batches, run
    port = str(_free_port())
    procs = [_run(["multihost", str(tmp_path / f"host{i}.json"), str(i), "2", port]) for i in range(2)]
    # The reference, in this process on one device while the hosts run: the batch the 2 hosts feed.
    per_host = [host_batches(i, 2) for i in range(2)]
    batches = [{k: np.concatenate([per_host[0][s][k], per_host[1][s][k]]) for k in per_host[0][s]}
               for s in range(len(per_host[0]))]
    reference, _ = run(Partitioner((1, 1, 1)), batches)
    for p in procs:
        _wait(p)
    hosts = [json.loads((tmp_path / f"host{i}.json").read_text()) for i in range(2)]
    assert [h["process_count"] for h in hosts] == [2, 2] and hosts[0]["device_count"] == 4
    assert hosts[0]["layout"]["num_devices"] == 4
    np.testing.assert_allclose(hosts[0]["losses"], hosts[1]["losses"], rtol=1e-6)
    np.testing.assert_allclose(hosts[0]["losses"], reference, rtol=2e-5)


def test_rules_map_logical_axes_to_mesh_axes():
    partitioner = Partitioner((1, 1, 1))
    rules = dict(DEFAULT_RULES)
    assert rules["batch"] == ("data", "fsdp") and rules["embed"] == "fsdp" and rules["mlp"] == "model"
    assert partitioner.sharding(P("embed", "mlp")).spec == P("fsdp", "model")
    assert partitioner.sharding(P("vocab", "embed")).spec == P("model", "fsdp")


def test_bad_mesh_and_batch_sizes_fail_clearly():
    with pytest.raises(ValueError, match="needs 8 devices"):
        Partitioner((2, 2, 2))
    partitioner = Partitioner((-1, 1, 1))
    with pytest.raises(ValueError, match="BATCH_SIZE=3 with 2 microbatch"):
        partitioner.check_batch_size(3, 2)
