"""gs:// run dirs against a GCS-protocol server on loopback (tests/gcs_emulator.py): everything a
run writes lands in the bucket, a run killed with SIGKILL resumes from it with the losses of an
uninterrupted run, and nothing is ever written to a local `gs:` folder.

Each storage layer is pointed at the server by its own variable: gcsfs (etils.epath without
TensorFlow) and google-cloud-storage (tensorboardX) by STORAGE_EMULATOR_HOST, tensorstore (orbax's
arrays, the run lock) by TENSORSTORE_GCS_HTTP_URL. TensorFlow's gfile has no endpoint setting, so
EPATH_USE_TF=false makes etils.epath use gcsfs even where TensorFlow is installed.
"""
import json
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
import pytest

from conftest import logged_losses
from t5lite.data import vocab as vocab_lib
from t5lite.errors import CheckpointError, ConfigError, DataError
from t5lite.infer import checkpoint_reader, evaluation
from t5lite.train import checkpoints, run_dir, summaries

pytest.importorskip("gcp_storage_emulator", reason="the GCS emulator is in the `test` extra")
gcsfs = pytest.importorskip("gcsfs", reason="gs:// paths without TensorFlow need the `gcs` extra")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "t5lite-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gcs():
    """The server's environment (also set in this process) and a gcsfs client to look into the bucket."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "gcs_emulator.py"), str(port), BUCKET],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}"
        env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url, "EPATH_USE_TF": "false",
               "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}  # no storage-layout calls to the real service
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        # etils caches whether to use TensorFlow's gfile on the first gs:// path it sees (an earlier
        # test in this process may have made one), so it must read EPATH_USE_TF again.
        from etils.epath import gpath
        gpath._is_tf_installed.cache_clear()
        try:
            # gcsfs.core's class: gcsfs.GCSFileSystem may be the one that asks the real service for bucket layouts
            yield env, gcsfs.core.GCSFileSystem(endpoint_url=url, token="anon", skip_instance_cache=True,
                                           use_listings_cache=False)
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
            gpath._is_tf_installed.cache_clear()
    finally:
        server.kill()
        server.wait()


def _scalars(event_file: bytes) -> dict:
    """{tag: [(step, value)]} of a TensorBoard event file: TFRecord framing (length, CRC, data, CRC)
    around Event protos."""
    from tensorboardX.proto.event_pb2 import Event
    scalars, offset = {}, 0
    while offset < len(event_file):
        length = int.from_bytes(event_file[offset:offset + 8], "little")
        event = Event.FromString(event_file[offset + 12:offset + 12 + length])
        offset += 16 + length
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def _no_local_gs_folder(*roots) -> None:
    """os.path.abspath('gs://b/run') is '<cwd>/gs:/b/run': no such folder may appear."""
    for root in roots:
        for folder, dirs, files in os.walk(root):
            assert not [n for n in dirs + files if n.startswith("gs:")], f"a local gs: path under {folder}"


def _train(model_dir, steps, env, cwd, wait=True):
    """`t5lite train` (the command of tpu_scripts/run.sh) on the tiny preset; a checkpoint every 2 steps."""
    cmd = [sys.executable, "-m", "t5lite.cli", "train", f"--gin_file={REPO}/configs/local/t5_tiny_pretrain.gin",
           f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}", "--gin.BATCH_SIZE=4",
           "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}", "--gin.train.log_every=1",
           "--gin.train.checkpoint_every=2"]
    proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **env, "PYTHONPATH": REPO}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return err


def _bucket_losses(fs, run) -> dict:
    """{step: loss} of the run's metrics.jsonl in the bucket ({} before the first step)."""
    if not fs.exists(f"{run}/metrics.jsonl"):
        return {}
    return {r["step"]: r["loss"] for r in map(json.loads, fs.cat(f"{run}/metrics.jsonl").decode().splitlines())}


def _committed_steps(fs, run) -> list[int]:
    return sorted(int(p.rsplit("/", 2)[-2]) for p in fs.glob(f"{run}/checkpoints/*/commit_success.txt"))


def test_a_gs_run_killed_with_sigkill_resumes_with_the_losses_of_an_uninterrupted_run(gcs, tmp_path):
    env, fs = gcs
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    run = f"{BUCKET}/killed"
    proc = _train(f"gs://{run}", 10_000, env, cwd, wait=False)
    start = time.time()
    while not _committed_steps(fs, run) or _committed_steps(fs, run)[-1] < 4 or \
            max(_bucket_losses(fs, run), default=0) < 5:  # killed between checkpoints, one possibly in flight
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        _no_local_gs_folder(cwd)
        assert time.time() - start < 240
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert fs.exists(f"{run}/RUN_LOCK")  # left behind by the killed run, taken over below
    reached = _committed_steps(fs, run)[-1]
    err = _train(f"gs://{run}", reached + 3, env, cwd)
    assert f"resumed from step {reached} in gs://{run}/checkpoints" in err
    assert "taking over the lock" in err
    straight = tmp_path / "straight"
    _train(straight, reached + 3, env, cwd)
    resumed, expected = _bucket_losses(fs, run), logged_losses(straight)
    assert sorted(resumed) == sorted(expected) == list(range(1, reached + 4))
    np.testing.assert_array_equal([resumed[s] for s in expected], list(expected.values()))

    files = set(fs.find(run))
    for name in ("config.gin", "model_config.json", "vocabulary.json", "loss.png",
                 f"config_history/0-config.gin", f"config_history/{reached}-model_config.json",
                 f"checkpoints/{reached + 3}/commit_success.txt"):
        assert f"{run}/{name}" in files, name
    assert [f for f in files if "/tensorboard/events.out.tfevents." in f]
    assert f"{run}/RUN_LOCK" not in files
    _no_local_gs_folder(tmp_path, REPO)


def test_run_dir_files_a_checkpoint_and_eval_outputs_land_in_the_bucket(gcs, tmp_path, monkeypatch, micro_config):
    _, fs = gcs
    monkeypatch.chdir(tmp_path)
    run = f"{BUCKET}/pieces"
    url = f"gs://{run}"
    run_dir.ensure_writable(url)
    assert not fs.find(run)  # the write check leaves nothing behind

    fs.pipe(f"{run}/RUN_LOCK", json.dumps({"host": "another-host", "pid": 1}).encode())
    with pytest.raises(CheckpointError, match=f"{url} is in use by another t5lite run \\(host another-host"):
        run_dir.RunLock(url).__enter__()
    fs.rm(f"{run}/RUN_LOCK")
    with run_dir.RunLock(url):
        assert json.loads(fs.cat(f"{run}/RUN_LOCK"))["pid"] == os.getpid()
    assert not fs.exists(f"{run}/RUN_LOCK")

    run_dir.record_config(url, micro_config, "train.seed = 1\n", 0, vocab_lib.DEFAULT_VOCABULARY)
    assert fs.cat(f"{run}/config_history/0-config.gin") == fs.cat(f"{run}/config.gin") == b"train.seed = 1\n"
    with pytest.raises(ConfigError, match="d_model: 32 -> 64"):
        run_dir.check_model_config(url, micro_config.replace(d_model=64), 3, False)
    assert json.loads(fs.cat(f"{run}/vocabulary.json"))["vocab_size"] == vocab_lib.DEFAULT_VOCABULARY.vocab_size
    vocab_lib.check_identity(url, vocab_lib.DEFAULT_VOCABULARY)

    writer = summaries.MetricsWriter(url)
    for step in (1, 2, 3):
        writer.write(step, {"loss": 4.0 - step})
    writer.close()
    events, = fs.glob(f"{run}/tensorboard/events.out.tfevents.*")
    assert _scalars(fs.cat(events)) == {"loss": [(1, 3.0), (2, 2.0), (3, 1.0)]}
    summaries.MetricsWriter(url, resume_step=2).close()  # a resumed run drops the steps past its checkpoint
    assert summaries.read_metrics(f"{url}/metrics.jsonl") == [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}]
    summaries.plot_loss_curve(f"{url}/metrics.jsonl", f"{url}/loss.png")
    assert fs.cat(f"{run}/loss.png").startswith(b"\x89PNG")

    ckpt = checkpoints.Checkpointer(f"{url}/checkpoints", save_every=1, async_save=False)
    assert ckpt.directory == f"{url}/checkpoints"
    for step in (1, 2):
        ckpt.save(step, {"params": {"w": np.full((8, 8), step, np.float32)}}, {"examples_consumed": step})
    ckpt.close()
    fs.pipe(f"{run}/checkpoints/3/state/_METADATA", b"{}")  # a step whose save was cut off: no commit file
    assert checkpoint_reader.step_directory(url) == f"{url}/checkpoints/2"
    fs.rm(f"{run}/checkpoints/3", recursive=True)
    for data in fs.glob(f"{run}/checkpoints/2/state/**/d/*"):  # step 2 loses its array data
        fs.rm(data)
    ckpt = checkpoints.Checkpointer(f"{url}/checkpoints", save_every=1, async_save=False)
    abstract = {"params": {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32)}}
    state, position, step = ckpt.restore_newest_readable(abstract)
    ckpt.close()
    assert (step, position) == (1, {"examples_consumed": 1})
    np.testing.assert_array_equal(state["params"]["w"], np.ones((8, 8)))
    assert fs.glob(f"{run}/damaged_checkpoints/2-*/state/*")
    assert checkpoint_reader.step_directory(url) == f"{url}/checkpoints/1"

    folder = f"{url}/eval/task.validation"
    evaluation.write_predictions(f"{folder}/predictions.jsonl", [{"prediction": "a"}, {"prediction": "b"}])
    for step in (1, 2):
        evaluation.append_metrics(f"{folder}/metrics.jsonl", {"step": step})
    assert fs.cat(f"{run}/eval/task.validation/predictions.jsonl") == b'{"prediction": "a"}\n{"prediction": "b"}\n'
    assert fs.cat(f"{run}/eval/task.validation/metrics.jsonl") == b'{"step": 1}\n{"step": 2}\n'
    _no_local_gs_folder(tmp_path, REPO)


def test_prepare_uploads_its_shards_and_manifest_to_the_bucket(gcs, tmp_path, monkeypatch):
    from t5lite import writable
    from t5lite.data.prepare import Options, prepare
    from t5lite.data.prepared import PreparedShards
    _, fs = gcs
    monkeypatch.setenv("T5LITE_CACHE", str(tmp_path / "cache"))  # the local staging folder
    monkeypatch.chdir(tmp_path)
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps({"text": "\n".join(f"Sentence {i} of page {k} says something plain." for i in
                                                         range(5)), "url": f"https://example.com/{k}"}) + "\n"
                           for k in range(3)))
    options = Options(language_filter=False)
    remote = prepare([str(raw)], f"gs://{BUCKET}/prepared", options=options, progress=False)
    local = prepare([str(raw)], str(tmp_path / "local"), options=options, progress=False)
    assert remote["counts"] == local["counts"] and local["counts"]["documents_kept"] == 3
    assert json.loads(fs.cat(f"{BUCKET}/prepared/manifest.json")) == remote
    for shard in local["shards"]:
        assert fs.cat(f"{BUCKET}/prepared/{shard['file']}") == (tmp_path / "local" / shard["file"]).read_bytes()
    assert not os.listdir(tmp_path / "cache" / "prepare")  # the staging folder is gone once uploaded
    with pytest.raises(ConfigError, match="already holds files"):
        prepare([str(raw)], f"gs://{BUCKET}/prepared", options=options, progress=False)
    with pytest.raises(DataError, match="read from a local folder"):
        PreparedShards(f"gs://{BUCKET}/prepared")
    writable.ensure_writable_file(f"gs://{BUCKET}/infer/predictions.jsonl", "--output")  # `t5lite infer --output`
    _no_local_gs_folder(tmp_path, REPO)


def test_of_runs_racing_for_a_gs_lock_exactly_one_creates_it(gcs):
    from t5lite import storage
    _, fs = gcs
    lock, racers = f"gs://{BUCKET}/race/RUN_LOCK", 8
    barrier, won = threading.Barrier(racers), []

    def race(i):
        barrier.wait()
        if storage.create_if_absent(lock, f"racer {i}"):
            won.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and fs.cat(lock[len("gs://"):]) == f"racer {won[0]}".encode()
    assert not storage.create_if_absent(lock, "late")


def test_embed_writes_its_npy_into_the_bucket(gcs, tmp_path, micro_config, capsys):
    """`embed --output gs://...`: the vectors land in the bucket, under the name numpy.save gives a
    path without .npy."""
    import gin

    from conftest import train_tiny
    from t5lite import cli
    _, fs = gcs
    run = str(tmp_path / "run")
    train_tiny(run, micro_config, 1)
    gin.clear_config()
    cli.main(["embed", f"--gin.CHECKPOINT_PATH='{run}'", f"--output=gs://{BUCKET}/vectors", "one text", "two"])
    assert f"to gs://{BUCKET}/vectors.npy" in capsys.readouterr().out
    with fs.open(f"{BUCKET}/vectors.npy", "rb") as f:
        vectors = np.load(f)
    assert vectors.shape == (2, micro_config.d_model) and np.isfinite(vectors).all()


@pytest.mark.parametrize("flags", [["--from_run", "{run}", "--quantize", "int8"], ["--to_hf", "{run}"]],
                         ids=["quantize", "to_hf"])
def test_convert_reads_a_run_in_the_bucket(gcs, tmp_path, flags, capsys):
    """`convert --from_run gs://... --quantize` and `--to_hf gs://...` find the run (no local `gs:` path)."""
    import flax.linen as nn

    from t5lite import cli, models
    from t5lite.interop import checkpoint, hf
    _, fs = gcs
    config = models.get_config("gpt2_tiny")
    module = models.build(config)
    shapes = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.key(0),
                                                         decoder_input_tokens=jnp.zeros((1, 4), jnp.int32))))
    variables = jax.tree.map(lambda s: np.full(s.shape, 0.01, np.float32), shapes)
    hf_dir = hf.save(config, variables, str(tmp_path / "hf"))
    with open(os.path.join(hf_dir, "vocab.txt"), "w") as f:   # a tokenizer the run records, and --quantize copies
        f.write("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
    local = str(tmp_path / "run")
    checkpoint.hf_to_t5lite(hf_dir, local)
    assert os.path.isfile(os.path.join(local, "tokenizer", "vocab.txt"))
    remote = f"{BUCKET}/convert_{flags[0].strip('-')}"
    fs.put(local, remote, recursive=True)
    out = tmp_path / "out"
    cli.main(["convert", *(f.format(run=f"gs://{remote}") for f in flags), "--out", str(out)])
    assert "wrote" in capsys.readouterr().out and os.listdir(out)
    assert not (out / checkpoint.PARTIAL_MARK).exists()
    if "--quantize" in flags:
        assert (out / "tokenizer" / "vocab.txt").read_text().endswith("hello\n") and (out / "vocabulary.json").is_file()
    _no_local_gs_folder(tmp_path, REPO)
