"""`benchmarks/step_profile.py` runs end to end at tiny sizes and prints its table: the traced op
time of one train step split into groups that add up to the whole, matmuls among them (no timing
is asserted)."""
import os
import subprocess
import sys

from conftest import REPO


def test_step_profile_prints_groups_that_add_up():
    args = ["--preset", "t5_tiny", "--batch", "2", "--inputs", "32", "--targets", "8"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "step_profile.py"), *args], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| group")]
    groups = {group.strip(): float(share.strip().rstrip("%")) for group, _, share in rows}
    assert abs(sum(groups.values()) - 100) < 1, run.stdout
    assert any(g.startswith("matmul: MLP") for g in groups) and any(g.startswith("matmul: attention") for g in groups), run.stdout
    assert all(float(ms) >= 0 for _, ms, _ in rows), run.stdout
