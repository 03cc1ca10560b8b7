"""`benchmarks/decode.py` runs end to end at tiny sizes and prints its table: every case decoded by
t5lite and by Hugging Face `generate` on the same weights, with the same greedy / best-beam tokens
(no timing is asserted). `--split` adds the first-token and loop columns."""
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("torch", reason="the benchmark compares with HF PyTorch (extras 'hf')")
pytest.importorskip("transformers", reason="the benchmark compares with HF transformers (extras 'hf')")


def test_decode_benchmark_prints_its_table_with_identical_tokens():
    args = ["--t5", "t5_tiny", "--gpt2", "gpt2_tiny", "--batch", "2", "--inputs", "12", "--prompt", "3", "6",
            "--new", "4", "--runs", "1", "--split"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "decode.py"), *args], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| t5_tiny")
            or line.startswith("| gpt2_tiny")]
    assert [r[0].strip() for r in rows] == ["t5_tiny greedy", "t5_tiny beam 4", "gpt2_tiny greedy"], run.stdout
    for name, ours, theirs, ratio, same, first, loop, step, loop_ratio in rows:
        assert float(ours) > 0 and float(theirs) > 0 and float(ratio) > 0, name
        assert same.strip() == "yes", (name, run.stdout)
        for pair in (first, loop, step):   # "t5lite / HF" seconds or ms: numbers (their sign is noise at this size)
            assert len([float(x) for x in pair.split("/")]) == 2, (name, pair)
        float(loop_ratio)
