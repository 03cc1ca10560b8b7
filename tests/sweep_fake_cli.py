"""A stand-in for `python -m t5lite.cli` in the sweep tests: `train` writes the metrics.jsonl a real
run would (pre-training losses, or a fine-tuning run's eval metric) in no time, from a hash of the
cell's bindings and seed, so the harness, resume and report can be tested without training.
A pre-training bound to evaluate at its last step (`train.eval_every`, a sweep's lenses) logs an
`eval_mlm_loss`, 0.5 lower for a cell named good*, and its `eval_unigram_loss` baseline, FAKE_UNIGRAM_LOSS (5.0 unless set). FAKE_SLEEP (seconds) slows each run, so a test can kill a sweep mid-way, and FAKE_STEP_SECONDS
each logged step, so a test sees the steps arrive; FAKE_STOP_AT (a step) ends
a pre-training there with exit code 0, as `t5lite train` stopped by SIGTERM does (its cost.json
seconds, like the trainer's, add up over resumes); a binding of a name
it does not know fails the run as the real CLI does, and so does a MODEL_DIR whose RUN_LOCK a live
process holds (the lock holds its holder's pid for the run's whole time). SIGTERM ends a run with
exit code 0 and its lock released, as it does a real one. A run started from a checkpoint writes
started_from.json: the path and the steps that run had logged, and a pre-training a config.gin. `probe`
writes a probe.json (fake_probe), `eval --forgetting` a forgetting.json (fake_forgetting)."""
import hashlib
import json
import os
import signal
import sys
import time

KNOWN = ("MODEL_DIR", "TRAIN_STEPS", "BATCH_SIZE", "MIXTURE_OR_TASK_NAME", "INITIAL_CHECKPOINT_PATH", "EVAL_EVERY",
         "DATA_DIR", "train.", "model_config.")
RUN_SECONDS = 100.0   # the wall time a fake pre-training run reports in its cost.json
UNIGRAM_LOSS = 5.0   # a fake pre-training's unigram baseline: above every cell's held-out loss (2.5 to 3.1)


def fake_probe(argv):
    """`probe`: a probe.json whose model scores 0.80 + a hash of the cell (0.10 more for a cell named
    good*) at its best layer and whose untrained control scores 0.60; FAKE_PROBE_FAIL fails it."""
    flags = dict(zip(argv[1::2], argv[2::2]))
    if os.environ.get("FAKE_PROBE_FAIL"):
        print("t5lite: error: --data_dir: no UD file", file=sys.stderr)
        return 2
    cell = os.path.basename(os.path.dirname(flags["--model"])).split("__seed")[0]
    digest = int(hashlib.sha256(flags["--model"].encode()).hexdigest()[:8], 16)
    best = 0.80 + (0.10 if cell.startswith("good") else 0.0) + digest % 100 / 10000
    name = flags["--name"]
    os.makedirs(flags["--out"], exist_ok=True)
    with open(os.path.join(flags["--out"], "probe.json"), "w") as f:
        json.dump({"model": name, flags["--probes"]: {name: {"accuracy": [best - 0.1, best, best - 0.05]},
                                                     f"{name} (untrained)": {"accuracy": [0.6, 0.58, 0.55]}}}, f)
    return 0


def fake_forgetting(argv):
    """`eval --forgetting`: the run's eval/forgetting.json, whose mlm_loss rose by 0.4 + a hash of the run
    (0.3 less for a cell named good*) and whose mlm_accuracy fell by a tenth of that, with the argv it
    was given; refused as the real one is when its gin file is missing. FAKE_EVAL_FAIL fails it."""
    flags = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
    run = flags["--gin.CHECKPOINT_PATH"].strip("'")
    if os.environ.get("FAKE_EVAL_FAIL") or not os.path.isfile(flags["--gin_file"]):
        print(f"t5lite: error: --gin_file {flags['--gin_file']}: no such file", file=sys.stderr)
        return 2
    cell = os.path.basename(os.path.dirname(run)).split("__seed")[0]
    rise = 0.4 - (0.3 if cell.startswith("good") else 0.0) + int(hashlib.sha256(run.encode()).hexdigest()[:8], 16) % 100 / 10000
    os.makedirs(os.path.join(run, "eval"), exist_ok=True)
    with open(os.path.join(run, "eval", "forgetting.json"), "w") as f:
        json.dump({"run": run, "base": flags["--forgetting_base"], "argv": argv,
                   "base_metrics": {"mlm_loss": 3.0, "mlm_accuracy": 0.2},
                   "run_metrics": {"mlm_loss": 3.0 + rise, "mlm_accuracy": 0.2 - rise / 10}}, f)
    return 0


def main(argv):
    if argv[0] == "probe":
        return fake_probe(argv)
    if argv[:2] == ["eval", "--forgetting"]:
        return fake_forgetting(argv)
    assert argv[0] == "train", argv
    bindings = dict(a[len("--gin."):].split("=", 1) for a in argv[1:] if a.startswith("--gin."))
    for name in bindings:
        if not name.startswith(KNOWN):
            print(f"t5lite: error: --gin.{name}: no configurable or macro named {name!r}", file=sys.stderr)
            return 2
    model_dir = bindings["MODEL_DIR"].strip("'")
    os.makedirs(model_dir, exist_ok=True)
    lock = os.path.join(model_dir, "RUN_LOCK")
    if not take_lock(lock):
        print(f"t5lite: error: {model_dir} is in use by another t5lite run", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        fake_train(bindings, model_dir)
    finally:
        os.remove(lock)
    return 0


def fake_train(bindings, model_dir):
    """Writes the run's metrics (and a pre-training's cost.json) after FAKE_SLEEP seconds, a step
    every FAKE_STEP_SECONDS."""
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    start = bindings.get("INITIAL_CHECKPOINT_PATH", "None").strip("'")
    if start != "None":   # what the run started from, and how many steps that run had logged by then
        metrics = os.path.join(start, "metrics.jsonl")
        logged = sum(1 for _ in open(metrics)) if os.path.exists(metrics) else 0
        with open(os.path.join(model_dir, "started_from.json"), "w") as f:
            json.dump({"path": start, "steps_logged": logged}, f)
    cell = os.path.basename(os.path.dirname(model_dir)).split("__seed")[0]
    key = "|".join(f"{n}={v}" for n, v in sorted(bindings.items()) if n not in ("MODEL_DIR", "INITIAL_CHECKPOINT_PATH"))
    digest = int(hashlib.sha256(f"{cell}|{key}".encode()).hexdigest()[:8], 16)
    steps = int(bindings["TRAIN_STEPS"])
    if "EVAL_EVERY" not in bindings and "FAKE_STOP_AT" in os.environ:
        steps = min(steps, int(os.environ["FAKE_STOP_AT"]))
    print("INFO t5lite: model Fake: 1.0M params; 1e+06 FLOPs/step; peak 1e+11 FLOP/s/device")
    print(f"INFO t5lite: trainable params: {1000 + len(cell)} || all params: {1000 + len(cell)} || trainable%: 100")
    if "EVAL_EVERY" not in bindings:   # a pre-training run's config and cost report; a resumed run adds to its seconds
        with open(os.path.join(model_dir, "config.gin"), "w") as f:
            f.write(f"MODEL_DIR = '{model_dir}'\n")
        cost_path = os.path.join(model_dir, "cost.json")
        earlier = json.load(open(cost_path))["seconds"] if os.path.exists(cost_path) else 0.0
        with open(cost_path, "w") as f:
            json.dump({"flops": 2e6 * steps, "device_hours": 0.5, "device": "fake", "seconds": earlier + RUN_SECONDS}, f)
    with open(os.path.join(model_dir, "metrics.jsonl"), "w") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps({"step": step, "loss": 5.0 / step + digest % 100 / 1000}) + "\n")
            f.flush()
            time.sleep(float(os.environ.get("FAKE_STEP_SECONDS", "0")))
        if "EVAL_EVERY" in bindings:
            bonus = 10.0 if cell.startswith("good") else 0.0
            f.write(json.dumps({"step": steps, "eval_accuracy": 50.0 + bonus + digest % 1000 / 100}) + "\n")
        elif bindings.get("train.eval_every") == str(steps):   # a pre-training evaluated at its last step
            gap = 0.5 if cell.startswith("good") else 0.0
            f.write(json.dumps({"step": steps, "eval_mlm_loss": 3.0 - gap + digest % 100 / 1000,
                                "eval_unigram_loss": float(os.environ.get("FAKE_UNIGRAM_LOSS", UNIGRAM_LOSS))}) + "\n")


def take_lock(path):
    """True once `path` holds this process's pid; False while a live process's pid is there (a lock
    whose holder is gone is taken over, as t5lite's RunLock does)."""
    try:
        with open(path) as f:
            holder = int(f.read())
        os.kill(holder, 0)
        return False
    except (FileNotFoundError, ValueError, ProcessLookupError):
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
