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
    # Step 1's loss agrees to float32 rounding; each update then carries the other summation order
    # of the sharded matmuls forward, so by step 3 the losses differ by about 2e-4 relative.
    np.testing.assert_allclose(result["sharded"], result["single"], rtol=1e-3)


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


def _expected_global_batches(layout, num_processes):
    """The global batches the hosts must build, derived from the layouts of sharding_worker.py:
    "interleaved": host p reads data shard p of P and holds data rows p and P + p (of 2P), so the
    first half of its batch goes to block p and the second half to block P + p; "ring": every
    host shares rows with its neighbours, so all read the one shard and it is the global batch."""
    from sharding_worker import host_batches
    if layout == "ring":
        return host_batches(0, 1)
    per_host = [host_batches(p, num_processes) for p in range(num_processes)]
    return [{k: np.concatenate([np.split(per_host[p][s][k], 2)[half] for half in range(2)
                                for p in range(num_processes)]) for k in per_host[0][s]}
            for s in range(len(per_host[0]))]


def _hosts_train_like_one_process(tmp_path, layout, num_processes):
    from sharding_worker import run
    port = str(_free_port())
    procs = [_run(["multihost", str(tmp_path / f"host{i}.json"), str(i), str(num_processes), port, layout])
             for i in range(num_processes)]
    # The reference, in this process on one device while the hosts run, fed the expected global batch.
    batches = _expected_global_batches(layout, num_processes)
    reference, _ = run(Partitioner((1, 1, 1)), batches)
    for p in procs:
        _wait(p)
    hosts = [json.loads((tmp_path / f"host{i}.json").read_text()) for i in range(num_processes)]
    assert [h["process_count"] for h in hosts] == [num_processes] * num_processes
    assert hosts[0]["device_count"] == hosts[0]["layout"]["num_devices"] == 2 * num_processes
    for host in hosts:
        for step, batch in enumerate(batches):
            np.testing.assert_array_equal(host["global"][step], batch["encoder_input_tokens"])
        np.testing.assert_allclose(host["losses"], hosts[0]["losses"], rtol=1e-6)
    # Step 1 agrees to float32 rounding; the sharded matmuls' other summation order then rides on
    # each update (as in test_mesh_2x2x2_trains_like_one_device).
    np.testing.assert_allclose(hosts[0]["losses"][0], reference[0], rtol=2e-5)
    np.testing.assert_allclose(hosts[0]["losses"], reference, rtol=1e-3)
    return hosts


def test_two_hosts_with_interleaved_rows_train_like_one_process(tmp_path):
    """Each host's devices hold non-adjacent rows of the batch (data rows 0, 2 and 1, 3): each
    host reads its own data shard and its rows land where the mesh puts them."""
    hosts = _hosts_train_like_one_process(tmp_path, "interleaved", 2)
    assert [h["shard"] for h in hosts] == [[0, 2], [1, 2]]


@pytest.mark.slow
def test_four_hosts_sharing_rows_in_a_ring_train_like_one_process(tmp_path):
    """4 hosts, each data row on two neighbouring hosts (the model axis across hosts): every host
    holds two non-adjacent rows shared with different hosts, reads the one data shard and keeps
    its rows."""
    hosts = _hosts_train_like_one_process(tmp_path, "ring", 4)
    assert [h["shard"] for h in hosts] == [[0, 1]] * 4


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


def _plan(rows_by_process):
    """Partitioner's feed plan for hosts holding the given data-parallel rows (no devices needed)."""
    import types
    stub = types.SimpleNamespace(_batch_rows_by_process=rows_by_process, mesh=types.SimpleNamespace(shape={}))
    stub._row_shards = Partitioner._row_shards.func(stub)
    return {p: Partitioner._feed_plan(stub, p) for p in rows_by_process}


def test_hosts_read_one_shard_per_set_of_hosts_sharing_rows():
    # v5e:4x4's FSDP mesh: 4 hosts, each holding 4 rows that are not adjacent.
    assert _plan({0: (0, 1, 6, 15), 1: (2, 3, 4, 5), 2: (7, 12, 13, 14), 3: (8, 9, 10, 11)}) == {
        0: (0, 4, (0, 1, 2, 3)), 1: (1, 4, (0, 1, 2, 3)), 2: (2, 4, (0, 1, 2, 3)), 3: (3, 4, (0, 1, 2, 3))}
    # A model axis across hosts in a ring: one shard of all 4 rows, each host keeps its own 2.
    assert _plan({0: (0, 3), 1: (0, 1), 2: (1, 2), 3: (2, 3)}) == {
        0: (0, 1, (0, 3)), 1: (0, 1, (0, 1)), 2: (0, 1, (1, 2)), 3: (0, 1, (2, 3))}
    with pytest.raises(ValueError, match="hosts hold unequal parts of the batch"):
        _plan({0: (0, 1), 1: (1, 2), 2: (3,)})
