"""The iso-FLOP scaling pilot (benchmarks/scaling_pilot.py, t5lite.experiments.scaling): its parabola
finds the compute-optimal size of Hoffmann et al.'s fitted loss, its budget is what the trainer
counts, and a real pilot at a tiny budget writes its table, JSON and figure."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

from t5lite.experiments import scaling

sys.path.insert(0, str(REPO / "benchmarks"))
import scaling_pilot  # noqa: E402

# Hoffmann et al. 2022 (Chinchilla), eq. 2 with the fitted constants of their section 3.3 / D.2:
# L(N, D) = E + A / N^alpha + B / D^beta; at C = 6 N D the loss-optimal N is eq. 4's
# N_opt(C) = G (C / 6)^(beta / (alpha + beta)), G = (alpha A / (beta B))^(1 / (alpha + beta)).
E, A, B, ALPHA, BETA = 1.69, 406.4, 410.7, 0.34, 0.28


def chinchilla_loss(n, budget):
    return E + A / n ** ALPHA + B / (budget / (6 * n)) ** BETA


def chinchilla_optimum(budget):
    g = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
    return g * (budget / 6) ** (BETA / (ALPHA + BETA))


@pytest.mark.parametrize("budget, shift", [(1e21, 1.0), (1e21, 1.7), (6.9e12, 0.5)])
def test_the_parabola_finds_chinchillas_compute_optimal_size(budget, shift):
    best = chinchilla_optimum(budget)
    sizes = best * shift * np.exp(np.linspace(-np.log(4), np.log(4), 7))   # x/÷4 around (or off) the optimum
    losses = chinchilla_loss(sizes, budget)
    fit = scaling.optimum(sizes, losses)
    assert fit["inside"] and fit["best_params"] == pytest.approx(best, rel=0.05)
    # the vertex's loss, to a twentieth of how much the loss varies over the sizes tried
    assert fit["best_loss"] == pytest.approx(chinchilla_loss(best, budget), abs=0.05 * np.ptp(losses))


def test_sizes_all_on_one_side_of_the_optimum_say_so():
    best = chinchilla_optimum(1e21)
    sizes = best * np.array([4.0, 8.0, 16.0])   # all larger: the loss only rises
    assert not scaling.optimum(sizes, chinchilla_loss(sizes, 1e21))["inside"]
    with pytest.raises(ValueError, match="3 or more sizes"):
        scaling.optimum(sizes[:2], [1.0, 2.0])


@pytest.mark.parametrize("budget, per_step", [(6.92e12, 2.77e9), (1e6, 3e5), (10.0, 1e9)])
def test_steps_spend_the_budget_to_half_a_step(budget, per_step):
    steps = scaling.steps_for_budget(budget, per_step)
    assert steps >= 1 and (abs(steps * per_step - budget) <= per_step / 2 or steps == 1)
    with pytest.raises(ValueError):
        scaling.steps_for_budget(budget, 0.0)


def test_the_default_budget_is_what_a_cpu_sweeps_bert_tiny_cell_spent():
    """The trainer's own cost accounting of a real cpu-scale run (peft_vs_full's `full` cell, a
    bert_tiny MLM pre-training of 2500 steps), stored in its report."""
    report = json.loads((REPO / "docs/results/sweeps_cpu/peft_vs_full_report.json").read_text())
    cost = report["cells"]["full"]["cost_per_seed"]
    assert report["cells"]["full"]["pretrain"] == scaling_pilot.PRETRAIN and cost["pretrain_steps"] == 2500
    assert 2500 * scaling_pilot.flops_per_step(scaling_pilot.REFERENCE) == pytest.approx(cost["cost_flops"], rel=1e-9)


def test_bad_sizes_are_one_line(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "benchmarks/scaling_pilot.py"), "--out", str(tmp_path),
                             "--sizes", "L2_H64,L9_H999"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 1 and "give 3 or more of L1_H32, L2_H64" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_pilot_at_a_tiny_budget_trains_each_size_on_it(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "benchmarks/scaling_pilot.py"), "--out", str(tmp_path),
                             "--sizes", "L1_H32,L2_H64,L3_H96", "--budget_tokens", "20480"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "scaling.json").read_text())
    budget = 10 * scaling_pilot.flops_per_step("L2_H64")   # 20480 tokens = 10 steps of 32 x 64
    assert written["budget_flops"] == pytest.approx(budget)
    for run in written["runs"]:   # the trainer's logged FLOPs/step, spent to half a step of the budget
        assert abs(run["steps"] * run["flops_per_step"] - budget) <= run["flops_per_step"] / 2
        logged = [json.loads(line) for line in (tmp_path / f"{run['size']}__seed0" / "metrics.jsonl").open()]
        assert run["loss"] == [r["eval_mlm_loss"] for r in logged if "eval_mlm_loss" in r][-1]
    assert [r["params"] for r in written["runs"]] == sorted(r["params"] for r in written["runs"])
    assert "| L2_H64 | 221,314 | 10 | 20,480 |" in result.stdout
    assert (tmp_path / "scaling.png").stat().st_size > 10_000
