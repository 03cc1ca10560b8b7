"""Never lose work, never hang, always say why: signals, damaged checkpoints, the run lock,
config changes on resume, unwritable directories, a run already at its last step, a diverging
run, a full disk, transient errors while restoring."""
import contextlib
import errno
import glob
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from etils import epath

from conftest import TINY_LENGTHS, TINY_TASK, logged_losses, shared_data_dir, train_tiny
from t5lite import cli
from t5lite.errors import CheckpointError, ConfigError
from t5lite.infer import checkpoint_reader
from t5lite.run_layout import RunDir
from t5lite.train import checkpoints, run_dir
from t5lite.train.trainer import NonFiniteLossError

TASK, LENGTHS = TINY_TASK, TINY_LENGTHS
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli_train(model_dir, steps, *extra, wait=True):
    """`t5lite train` on the tiny preset, small batches, a checkpoint only at the end (or on a signal)."""
    cmd = [sys.executable, "-m", "t5lite.cli", "train", "--gin_file=configs/local/t5_tiny_pretrain.gin",
           f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}", "--gin.BATCH_SIZE=4",
           "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}", "--gin.train.log_every=1",
           "--gin.train.checkpoint_every=1000", *extra]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def _steps_on_disk(model_dir):
    return sorted(int(d) for d in os.listdir(os.path.join(model_dir, "checkpoints")) if d.isdigit())


def _wait_for(condition, proc, timeout=240):
    start = time.time()
    while not condition():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() - start < timeout
        time.sleep(0.2)


# --- 1. SIGTERM / SIGINT -------------------------------------------------------------------------

def _logged_steps(model_dir):
    path = os.path.join(model_dir, "metrics.jsonl")
    return len(logged_losses(model_dir)) if os.path.exists(path) else 0


class _Received(logging.Handler):
    """Sets `event` when the trainer logs that a signal was received (its handler has run)."""

    def __init__(self):
        super().__init__()
        self.event = threading.Event()

    def emit(self, record):
        if "received" in record.getMessage():
            self.event.set()


@contextlib.contextmanager
def _signals_after_logged_step(model_dir, signum, times=1, step=2):
    """Sends `signum` to this process (`times` times) from a thread once `step` is logged; each
    next one once the handler has run for the one before (signals that arrive while the main
    thread is inside a computation are merged into one, as the OS delivers them). Nothing is sent
    once the block has ended: a late signal would stop whichever test this worker runs next."""
    received, done = _Received(), threading.Event()
    logger = logging.getLogger("t5lite")

    def send():
        while _logged_steps(model_dir) < step:
            if done.wait(0.05):
                return
        logger.addHandler(received)
        try:
            for k in range(times):
                if done.is_set():
                    return
                os.kill(os.getpid(), signum)
                if k + 1 < times and not received.event.wait(timeout=60):
                    return
        finally:
            logger.removeHandler(received)
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        received.event.set()   # ends a wait for the handler
        thread.join()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_training_after_the_step_with_its_checkpoint(tmp_path, micro_config, caplog, signum):
    handler_before = signal.getsignal(signum)
    with caplog.at_level(logging.WARNING, logger="t5lite"), _signals_after_logged_step(str(tmp_path), signum):
        last = train_tiny(tmp_path, micro_config, 10_000, checkpoint_every=1000)
    reached = max(logged_losses(tmp_path))
    assert 2 <= reached < 10_000 and last  # returned normally, with the last metrics
    assert _steps_on_disk(str(tmp_path))[-1] == reached
    name = signal.Signals(signum).name
    assert any(f"stopped by {name} at step {reached}" in r.getMessage() for r in caplog.records)
    assert signal.getsignal(signum) is handler_before and not RunDir(tmp_path).lock.exists()


def test_a_second_sigint_aborts_at_once(tmp_path, micro_config):
    with pytest.raises(KeyboardInterrupt), _signals_after_logged_step(str(tmp_path), signal.SIGINT, times=2):
        train_tiny(tmp_path, micro_config, 10_000, checkpoint_every=1000)
    assert not RunDir(tmp_path).lock.exists()


@pytest.mark.slow
def test_sigterm_saves_the_reached_step_and_resuming_equals_an_uninterrupted_run(tmp_path):
    run = str(tmp_path / "interrupted")
    proc = _cli_train(run, 10_000, wait=False)
    _wait_for(lambda: _logged_steps(run) >= 2, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    reached = _steps_on_disk(run)[-1]
    assert 2 <= reached < 10_000 and f"stopped by SIGTERM at step {reached}" in err
    assert os.path.join(run, "checkpoints") in err
    code, _, err = _cli_train(run, reached + 2)
    assert code == 0, err[-3000:]
    assert f"resumed from step {reached}" in err
    straight = str(tmp_path / "straight")
    code, _, err = _cli_train(straight, reached + 2)
    assert code == 0, err[-3000:]
    resumed, expected = logged_losses(run), logged_losses(straight)
    assert sorted(resumed) == sorted(expected) == list(range(1, reached + 3))
    np.testing.assert_allclose([resumed[s] for s in expected], list(expected.values()), rtol=1e-6)


# --- 2. damaged checkpoints ----------------------------------------------------------------------

def _array(step):
    return jnp.arange(4096.0).reshape(64, 64) * step


ABSTRACT = {"params": {"w": jax.ShapeDtypeStruct((64, 64), jnp.float32)}}


def _save_steps(directory, steps):
    ckpt = checkpoints.Checkpointer(directory, save_every=1, async_save=False)
    for step in steps:
        ckpt.save(step, {"params": {"w": _array(step)}}, {"examples_consumed": 10 * step})
    ckpt.close()


def _truncate_array_file(step_dir):
    """Cuts the largest array data file of the `state` item in half (what a full disk leaves)."""
    files = [f for f in glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True)
             if os.path.isfile(f)]
    biggest = max(files, key=os.path.getsize)
    with open(biggest, "r+b") as f:
        f.truncate(os.path.getsize(biggest) // 2)


def test_damaged_latest_step_is_named_set_aside_and_the_previous_one_restored(tmp_path, caplog):
    directory = str(tmp_path / "checkpoints")
    _save_steps(directory, [1, 2])
    _truncate_array_file(os.path.join(directory, "2"))
    ckpt = checkpoints.Checkpointer(directory, save_every=1)
    with caplog.at_level(logging.WARNING, logger="t5lite"):
        state, data, step = ckpt.restore_newest_readable(ABSTRACT)
    assert step == 1 and data == {"examples_consumed": 10}
    np.testing.assert_array_equal(np.asarray(state["params"]["w"]), _array(1))
    damaged = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert damaged and "step 2" in damaged[0] and len(damaged[0].splitlines()) == 1
    # Nothing is deleted: step 2 moved aside whole, and a new step 2 can be saved.
    assert [os.path.basename(p).split("-")[0] for p in glob.glob(str(tmp_path / "damaged_checkpoints" / "*"))] == ["2"]
    assert ckpt.save(2, {"params": {"w": jnp.zeros((64, 64))}}, {"examples_consumed": 0}, force=True)
    ckpt.close()
    assert _steps_on_disk(str(tmp_path)) == [1, 2]


def test_when_no_step_reads_the_error_names_each_and_nothing_moves(tmp_path):
    directory = str(tmp_path / "checkpoints")
    _save_steps(directory, [1])
    _truncate_array_file(os.path.join(directory, "1"))
    ckpt = checkpoints.Checkpointer(directory, save_every=1)
    with pytest.raises(CheckpointError, match="step 1: .*Nothing was changed"):
        ckpt.restore_newest_readable(ABSTRACT)
    ckpt.close()
    assert _steps_on_disk(str(tmp_path)) == [1] and not (tmp_path / "damaged_checkpoints").exists()


def test_training_resumes_from_the_step_before_a_damaged_one(tmp_path, micro_config, caplog):
    train_tiny(tmp_path, micro_config, 6)  # checkpoints at 3 and 6
    _truncate_array_file(str(tmp_path / "checkpoints" / "6"))
    with caplog.at_level(logging.WARNING, logger="t5lite"):
        train_tiny(tmp_path, micro_config, 7)
    assert any("step 6" in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records)
    assert sorted(logged_losses(tmp_path)) == list(range(1, 8))  # steps 4-6 trained again, then 7
    assert _steps_on_disk(str(tmp_path)) == [3, 6, 7]


def test_loading_a_checkpoint_logs_no_missing_metadata_warning(tmp_path, caplog):
    ckpt = checkpoints.Checkpointer(str(tmp_path / "checkpoints"), save_every=1, async_save=False)
    ckpt.save(1, {"params": {"w": jnp.arange(4096.0).reshape(64, 64)}}, {"examples_consumed": 1})
    ckpt.close()
    with caplog.at_level(logging.WARNING):
        params = checkpoint_reader.restore_params(str(tmp_path), {"w": jax.ShapeDtypeStruct((64, 64), jnp.float32)})
    np.testing.assert_array_equal(np.asarray(params["w"]), np.arange(4096.0).reshape(64, 64))
    assert not [r for r in caplog.records if "_CHECKPOINT_METADATA" in r.getMessage()]


# --- 3. the run lock -----------------------------------------------------------------------------

def _write_lock(model_dir, host, pid):
    os.makedirs(model_dir, exist_ok=True)
    with RunDir(model_dir).lock.open("w") as f:
        json.dump({"host": host, "pid": pid}, f)


def test_a_lock_held_by_a_live_process_or_another_host_refuses_naming_it(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_lock(tmp_path, socket.gethostname(), sleeper.pid)
        with pytest.raises(CheckpointError, match=f"host {socket.gethostname()}, pid {sleeper.pid}"):
            run_dir.RunLock(str(tmp_path)).__enter__()
    finally:
        sleeper.kill()
        sleeper.wait()
    _write_lock(tmp_path, "some-other-host", 12345)
    with pytest.raises(CheckpointError, match="host some-other-host, pid 12345"):
        run_dir.RunLock(str(tmp_path)).__enter__()


def test_a_stale_lock_is_taken_over_and_released_at_the_end(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_lock(tmp_path, socket.gethostname(), dead.pid)
    lock_path = RunDir(tmp_path).lock
    with run_dir.RunLock(str(tmp_path)):
        assert json.loads(lock_path.read_text()) == {"host": socket.gethostname(), "pid": os.getpid()}
    assert not lock_path.exists()


@pytest.mark.slow
def test_a_second_run_on_the_same_model_dir_is_refused_while_the_first_finishes(tmp_path):
    run = str(tmp_path / "run")
    first = _cli_train(run, 150, wait=False)
    _wait_for(lambda: _logged_steps(run) >= 1, first)
    started = time.time()
    code, _, err = _cli_train(run, 150)
    assert code != 0 and f"pid {first.pid}" in err and "in use by another t5lite run" in err
    assert time.time() - started < 60  # refused before building anything (the import of jax dominates)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert _steps_on_disk(run)[-1] == 150 and sorted(logged_losses(run)) == list(range(1, 151))
    assert not RunDir(run).lock.exists()


# --- 4. a changed model config on resume ---------------------------------------------------------

def test_resuming_with_another_model_config_is_refused_unless_allowed_and_recorded(tmp_path, micro_config):
    train_tiny(tmp_path, micro_config.replace(dropout_rate=0.0), 2)
    with pytest.raises(ConfigError, match=r"dropout_rate: 0\.0 -> 0\.3.*allow_config_change=True"):
        train_tiny(tmp_path, micro_config.replace(dropout_rate=0.3), 4)
    assert json.loads((tmp_path / "model_config.json").read_text())["dropout_rate"] == 0.0
    train_tiny(tmp_path, micro_config.replace(dropout_rate=0.3), 4, allow_config_change=True)
    history = tmp_path / "config_history"
    assert json.loads((history / "0-model_config.json").read_text())["dropout_rate"] == 0.0
    assert json.loads((history / "2-model_config.json").read_text())["dropout_rate"] == 0.3
    assert (history / "0-config.gin").exists() and (history / "2-config.gin").exists()
    assert json.loads((tmp_path / "model_config.json").read_text())["dropout_rate"] == 0.3


# --- 5. unwritable places ------------------------------------------------------------------------

def test_a_file_where_checkpoints_should_be_fails_at_once_naming_it(tmp_path, micro_config):
    (tmp_path / "checkpoints").write_text("not a directory")
    started = time.time()
    with pytest.raises(CheckpointError, match=str(tmp_path / "checkpoints")):
        train_tiny(tmp_path, micro_config, 2)
    assert time.time() - started < 5


def test_a_model_dir_under_a_file_fails_at_once_naming_it(tmp_path, micro_config):
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match=str(tmp_path / "file" / "run")):
        train_tiny(tmp_path / "file" / "run", micro_config, 2)


# --- 6. nothing to do ----------------------------------------------------------------------------

def test_train_steps_at_the_saved_step_says_so(tmp_path, micro_config, caplog):
    train_tiny(tmp_path, micro_config, 2)
    with caplog.at_level(logging.WARNING, logger="t5lite"):
        assert train_tiny(tmp_path, micro_config, 1) == {}
    assert any("already at step 2" in r.getMessage() and "raise TRAIN_STEPS" in r.getMessage()
               for r in caplog.records)


# --- 7. every host's own data position -----------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Short sentences: packing fits a different number into each host's rows.
SST2, SST2_LENGTHS = "glue_sst2", {"inputs": 64, "targets": 8}


def _start_two_hosts(model_dir, steps):
    port = str(_free_port())
    worker = os.path.join(REPO, "tests", "train_worker.py")
    env = {**os.environ, "PYTHONPATH": REPO}
    args = [port, model_dir, str(steps), SST2, str(shared_data_dir() / "glue")]
    return [subprocess.Popen([sys.executable, worker, str(i), "2", *args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for i in range(2)]


def _finish(procs):
    outputs = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        assert p.returncode == 0, out[-3000:]
        outputs.append(out)
    return outputs


def _two_hosts(model_dir, steps):
    return _finish(_start_two_hosts(model_dir, steps))


def _saved_positions(model_dir, step):
    with open(os.path.join(model_dir, "checkpoints", str(step), "data", "metadata")) as f:
        return json.load(f)


def _position_after(process_index, steps):
    """The data position of host `process_index` of 2 after `steps` batches of 2, read by a fresh loader."""
    from t5lite.data import get_task
    from t5lite.data.loader import Loader
    loader = Loader(get_task(SST2), "train", SST2_LENGTHS, 4, shard_index=process_index, shard_count=2,
                    data_dir=str(shared_data_dir() / "glue"))
    batches = iter(loader)
    for _ in range(steps):
        next(batches)
    return loader.state()


@pytest.mark.slow
def test_each_of_two_hosts_resumes_at_its_own_data_position(tmp_path):
    expected_at_2, expected_at_4 = ([_position_after(i, s) for i in range(2)] for s in (2, 4))
    assert expected_at_2[0] != expected_at_2[1]  # the hosts' positions differ
    run = str(tmp_path / "run")
    _two_hosts(run, 2)
    saved = _saved_positions(run, 2)
    assert [saved[str(i)] for i in range(2)] == expected_at_2
    _two_hosts(run, 4)  # resumes from step 2: each host must continue from its own position
    saved = _saved_positions(run, 4)
    assert [saved[str(i)] for i in range(2)] == expected_at_4
    assert [saved[str(i)]["shard_index"] for i in range(2)] == [0, 1]


def test_data_positions_are_kept_per_process_and_a_missing_one_is_refused(tmp_path):
    directory = str(tmp_path / "checkpoints")
    _save_steps(directory, [1])
    assert _saved_positions(str(tmp_path), 1) == {"0": {"examples_consumed": 10}}
    with open(os.path.join(directory, "1", "data", "metadata"), "w") as f:
        json.dump({"1": {"examples_consumed": 10}}, f)  # written by a slice where this is not a host
    ckpt = checkpoints.Checkpointer(directory, save_every=1)
    with pytest.raises(CheckpointError, match=r"processes \['1'\], not of this process \(0\)"):
        ckpt.restore(ABSTRACT)
    ckpt.close()


def test_a_checkpoint_of_another_model_is_reported_not_treated_as_damage(tmp_path):
    directory = str(tmp_path / "checkpoints")
    ckpt = checkpoints.Checkpointer(directory, save_every=1, async_save=False)
    ckpt.save(1, {"params": {"w": jnp.zeros((64, 64))}}, {"examples_consumed": 1})
    ckpt.close()
    ckpt = checkpoints.Checkpointer(directory, save_every=1)
    abstract = {"params": {"w": jax.ShapeDtypeStruct((32, 64), jnp.float32)}}
    with pytest.raises(CheckpointError, match=r"another model \(w: \(64, 64\) in the checkpoint, \(32, 64\)"):
        ckpt.restore_newest_readable(abstract)
    ckpt.close()
    assert _steps_on_disk(str(tmp_path)) == [1]


@pytest.mark.slow
def test_sigterm_to_one_host_stops_both_at_the_same_saved_step(tmp_path):
    run = str(tmp_path / "run")
    procs = _start_two_hosts(run, 10_000)
    _wait_for(lambda: _logged_steps(run) >= 2, procs[0])
    procs[1].send_signal(signal.SIGTERM)  # only host 1 is preempted; JAX's sync point tells host 0
    outputs = _finish(procs)
    reached = _steps_on_disk(run)[-1]
    assert 2 <= reached < 10_000
    for out in outputs:
        assert f"stopped by SIGTERM at step {reached}" in out
    assert sorted(_saved_positions(run, reached)) == ["0", "1"]


# --- 8. a diverging run --------------------------------------------------------------------------

def test_a_diverging_run_keeps_its_last_finite_checkpoint_names_it_and_it_loads(tmp_path, micro_config):
    """The learning rate turns NaN at the third update: steps 1-2 are finite, every later one is not.
    Checkpoints every 2 steps, keep 3, the loss checked only every 10: saving 4, 6 and 8 would
    rotate out step 2, the only finite one."""
    schedule = lambda count: jnp.where(count < 2, 0.01, jnp.nan)  # noqa: E731
    with pytest.raises(NonFiniteLossError) as raised:
        train_tiny(tmp_path, micro_config, 12, optimizer=(optax.sgd(schedule), schedule),
                   checkpoint_every=2, keep_checkpoints=3, log_every=10)
    assert _steps_on_disk(str(tmp_path)) == [1, 2]  # orbax saves the first step too
    message = cli.user_message(raised.value)  # what `t5lite train` prints
    assert "the last finite checkpoint is step 2 in " + str(tmp_path / "checkpoints") in message
    assert len(message.splitlines()) == 1
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _params_of(micro_config))
    params = checkpoint_reader.restore_params(str(tmp_path / "checkpoints" / "2"), abstract)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


def _params_of(config):
    import flax.linen as nn
    from t5lite.models import build
    tokens = jnp.zeros((1, 4), jnp.int32)
    return nn.unbox(jax.eval_shape(lambda: build(config).init(jax.random.PRNGKey(0), encoder_input_tokens=tokens,
                                                              decoder_input_tokens=tokens)))["params"]


# --- 9. what counts as damage --------------------------------------------------------------------

def _overwrite(path, text):
    with open(path, "w") as f:
        f.write(text)


def _garble(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        f.write(b"\xff" * 8)


@pytest.mark.parametrize("damage", [
    lambda step_dir: _garble(os.path.join(step_dir, "data", "metadata")),  # JSON that doesn't decode
    lambda step_dir: _garble(os.path.join(step_dir, "state", "_METADATA")),  # orbax's tree metadata
    lambda step_dir: os.remove(os.path.join(step_dir, "state", "manifest.ocdbt")),  # a missing file
    lambda step_dir: _overwrite(os.path.join(step_dir, "state", "_METADATA"), "{}"),  # JSON, not orbax's
    lambda step_dir: _overwrite(os.path.join(step_dir, "data", "metadata"), "5"),
], ids=["garbled_json", "garbled_metadata", "missing_manifest", "foreign_metadata", "foreign_data_item"])
def test_a_garbled_or_missing_file_is_set_aside_and_the_previous_step_loads(tmp_path, damage):
    directory = str(tmp_path / "checkpoints")
    _save_steps(directory, [1, 2])
    damage(os.path.join(directory, "2"))
    ckpt = checkpoints.Checkpointer(directory, save_every=1)
    state, _, step = ckpt.restore_newest_readable(ABSTRACT)
    ckpt.close()
    assert step == 1 and _steps_on_disk(str(tmp_path)) == [1]
    np.testing.assert_array_equal(np.asarray(state["params"]["w"]), _array(1))
    assert os.listdir(tmp_path / "damaged_checkpoints")[0].startswith("2-")


def _wrapped(cause):
    """Orbax's wrapping of a failed array read (serialization._read_array_index_and_device_put)."""
    try:
        raise Exception("Encountered error while reading array index") from cause
    except Exception as e:  # noqa: BLE001
        return e


@pytest.mark.parametrize("error", [
    MemoryError(),
    OSError(errno.EIO, "Input/output error"),
    OSError(errno.ENOSPC, "No space left on device"),
    PermissionError(errno.EACCES, "Permission denied"),
    ValueError("UNAVAILABLE: Error reading gs://bucket/run/checkpoints/2/state: HTTP response code: 503"),
    ValueError("RESOURCE_EXHAUSTED: Error reading local file \"/x/2/state/d/ab\" [os_error_code='12']"),
    _wrapped(MemoryError()),
], ids=["MemoryError", "EIO", "ENOSPC", "EACCES", "ts_unavailable", "ts_out_of_memory", "wrapped_MemoryError"])
def test_a_transient_error_while_restoring_propagates_and_moves_nothing(tmp_path, monkeypatch, error):
    directory = str(tmp_path / "checkpoints")
    _save_steps(directory, [1, 2])

    def fail(*args, **kwargs):
        raise error
    ckpt = checkpoints.Checkpointer(directory, save_every=1)
    monkeypatch.setattr(ocp.JsonCheckpointHandler, "restore", fail)  # the `data` item's reader
    with pytest.raises(type(error)) as raised:
        ckpt.restore_newest_readable(ABSTRACT)
    ckpt.close()
    assert raised.value is error
    assert _steps_on_disk(str(tmp_path)) == [1, 2] and not (tmp_path / "damaged_checkpoints").exists()
    monkeypatch.undo()  # the storage recovers: the newest step reads
    ckpt = checkpoints.Checkpointer(directory, save_every=1)
    assert ckpt.restore_newest_readable(ABSTRACT)[2] == 2
    ckpt.close()


@pytest.mark.parametrize("error, damaged", [
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), True),
    (json.JSONDecodeError("Expecting value", "", 0), True),
    (ValueError("DATA_LOSS: Error decoding manifest"), True),
    (ValueError("OUT_OF_RANGE: Requested byte range [0, 243) is not valid for value of size 121"), True),
    (ValueError("NOT_FOUND: Error reading local file \"/x/2/state/d/ab\" [os_error_code='2']"), True),
    (_wrapped(ValueError("Error decoding b-tree node: ZSTD_decompressStream() failed: Data corruption")), True),
    (ValueError("PERMISSION_DENIED: Error reading gs://bucket/2/state"), False),
    (ValueError("DEADLINE_EXCEEDED: Error reading gs://bucket/2/state"), False),
    (ValueError("Error writing local file [OS error 5: Input/output error]"), False),
    (RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 4 GiB"), False),  # jax's device OOM
    (KeyboardInterrupt(), False),
])
def test_only_corruption_counts_as_damage(error, damaged):
    assert checkpoints.is_corruption(error) is damaged


# --- 10. a full disk -----------------------------------------------------------------------------

def _disk_full_from_step(monkeypatch, directory, step):
    """Every text write of orbax (the data item, the step metadata) into a step >= `step` of
    `directory` fails as on a full disk; TensorStore's array writes are not touched."""
    write_text = epath.Path.write_text

    def full(self, *args, **kwargs):
        relative = os.path.relpath(os.fspath(self), directory)
        first = relative.split(os.sep)[0].split(".")[0]
        if not relative.startswith("..") and first.isdigit() and int(first) >= step:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(self))
        return write_text(self, *args, **kwargs)
    monkeypatch.setattr(epath.Path, "write_text", full)


@pytest.mark.parametrize("async_save, keep", [(True, 3), (False, 3), (True, 1)])
def test_a_full_disk_is_one_error_naming_the_directory_and_keeps_the_last_checkpoint(tmp_path, monkeypatch,
                                                                                    async_save, keep, caplog):
    """keep=1: orbax stops tracking step 1 when step 2 starts, and deletes it only once 2 is committed."""
    directory = str(tmp_path / "checkpoints")
    _disk_full_from_step(monkeypatch, directory, 2)
    ckpt = checkpoints.Checkpointer(directory, save_every=1, keep=keep, async_save=async_save)
    ckpt.save(1, {"params": {"w": _array(1)}}, {"examples_consumed": 10})
    ckpt.wait()
    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointError) as raised:
        ckpt.save(2, {"params": {"w": _array(2)}}, {"examples_consumed": 20})
        ckpt.save(3, {"params": {"w": _array(3)}}, {"examples_consumed": 30})  # an async failure shows here
        ckpt.close()
    ckpt.close()
    message = str(raised.value)
    assert message.startswith(f"no space left on {directory}") and "step 1, is kept" in message
    assert raised.value.__cause__ is None and len(message.splitlines()) == 1
    assert not [r for r in caplog.records if r.exc_info]  # orbax's tracebacks of the failed save are dropped
    monkeypatch.undo()
    ckpt = checkpoints.Checkpointer(directory, save_every=1)
    state, _, step = ckpt.restore_newest_readable(ABSTRACT)
    assert step == 1
    np.testing.assert_array_equal(np.asarray(state["params"]["w"]), _array(1))
    ckpt.close()


@pytest.fixture
def clean_gin():
    """`t5lite train` in this process binds gin; later tests must not see those bindings."""
    import gin
    gin.clear_config()
    yield
    gin.clear_config()


def test_a_full_disk_during_training_exits_2_with_one_line(tmp_path, monkeypatch, capsys, clean_gin):
    run = tmp_path / "run"
    _disk_full_from_step(monkeypatch, str(run / "checkpoints"), 2)
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", f"--gin_file={REPO}/configs/local/t5_tiny_pretrain.gin", f"--gin.MODEL_DIR='{run}'",
                  "--gin.TRAIN_STEPS=3", "--gin.BATCH_SIZE=4", "--gin.train.checkpoint_every=1",
                  "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    errors = [line for line in err.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert errors == [f"t5lite: error: no space left on {run / 'checkpoints'}: a checkpoint could not be written; "
                      "the last complete checkpoint, step 1, is kept. Free space there (or move MODEL_DIR), then "
                      "rerun the same command to resume"]
    assert _steps_on_disk(str(run)) == [1]


def test_a_lock_of_an_exited_but_unreaped_process_is_stale(tmp_path):
    """In a container whose init reaps no orphans, a killed run stays a zombie that os.kill(pid, 0)
    still finds; its lock must not block the rerun. (Linux: the zombie is read from /proc.)"""
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])   # not waited for: a zombie until the end
    stat = f"/proc/{zombie.pid}/stat"
    deadline = time.time() + 60
    while open(stat).read().rpartition(")")[2].split()[0] != "Z":
        assert time.time() < deadline
        time.sleep(0.1)
    try:
        _write_lock(tmp_path, socket.gethostname(), zombie.pid)
        with run_dir.RunLock(str(tmp_path)):
            assert json.loads(RunDir(tmp_path).lock.read_text())["pid"] == os.getpid()
    finally:
        zombie.wait()
