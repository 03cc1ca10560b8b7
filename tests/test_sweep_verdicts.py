"""The sweep report's statistics against their references: each task's constant baseline equals
sklearn's DummyClassifier on the same dev labels, the at-chance rule reads scipy's t-interval, the
equivalence test is statsmodels' `ttost_paired`, the seeds a claim needs are statsmodels'
`TTestPower().solve_power` and a brute-force noncentral-t re-derivation, and a report keeps
at-chance entries out of its average and verdicts."""
import csv
import json
import math

import numpy as np
import pytest

from conftest import shared_data_dir

from t5lite.experiments import report, spec, stats

scipy_stats = pytest.importorskip("scipy.stats", reason="the intervals' reference")
dummy = pytest.importorskip("sklearn.dummy", reason="the constant-prediction reference")
sk_metrics = pytest.importorskip("sklearn.metrics", reason="the F1 and MCC references (the `test` extra)")
power = pytest.importorskip("statsmodels.stats.power", reason="the power analysis' reference (the `test` extra)")
weightstats = pytest.importorskip("statsmodels.stats.weightstats", reason="the TOST reference (the `test` extra)")

GLUE = shared_data_dir() / "glue"
# (folder, label column or headerless index, label parser) as GLUE's dev.tsv files hold them
DEV = {"sst2": ("SST-2", "label", int), "rte": ("RTE", "label", lambda v: int(v == "not_entailment")),
       "mrpc": ("MRPC", "Quality", int), "cola": ("CoLA", 1, int), "stsb": ("STS-B", "score", float)}


def tsv_labels(task, limit=None):
    """A GLUE dev file's labels, read here with csv (not through t5lite)."""
    folder, column, parse = DEV[task]
    with open(GLUE / folder / "dev.tsv", encoding="utf-8-sig", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        if isinstance(column, str):
            column = next(rows).index(column)
        return [parse(row[column]) for row in rows][:limit]


def glue_spec(eval_max_examples=None):
    return spec.sweep(name="glue", scale="ci", cells={"a": {"pretrain": ["p.gin"], "finetune": ["f.gin"]}},
                      tasks={"sst2": "accuracy", "rte": "accuracy", "mrpc": "f1", "cola": "matthews_corrcoef",
                             "stsb": "pearson_corrcoef"},
                      scales={"ci": {"eval_max_examples": eval_max_examples}}, data_dir=str(GLUE))


@pytest.mark.parametrize("limit", [None, 16])
def test_each_tasks_baseline_is_sklearns_constant_predictor_on_the_dev_examples_scored(limit):
    known, note = report.baselines(glue_spec(limit))
    assert note is None
    x = lambda labels: np.zeros((len(labels), 1))   # noqa: E731  (a dummy ignores its inputs)
    for task in ("sst2", "rte"):   # accuracy: the majority class
        labels = tsv_labels(task, limit)
        majority = dummy.DummyClassifier(strategy="most_frequent").fit(x(labels), labels)
        assert known[task] == pytest.approx(100 * majority.score(x(labels), labels), rel=1e-12)
    labels = tsv_labels("mrpc", limit)   # F1: every example called positive
    positive = dummy.DummyClassifier(strategy="constant", constant=1).fit(x(labels), labels).predict(x(labels))
    assert known["mrpc"] == pytest.approx(100 * sk_metrics.f1_score(labels, positive), rel=1e-12)
    if limit is None:
        assert known["mrpc"] == pytest.approx(81.2, abs=0.05)   # MRPC dev's all-positive F1
    labels = tsv_labels("cola", limit)
    predicted = dummy.DummyClassifier(strategy="most_frequent").fit(x(labels), labels).predict(x(labels))
    assert known["cola"] == sk_metrics.matthews_corrcoef(labels, predicted) == 0
    labels = tsv_labels("stsb", limit)   # scipy: a constant's correlation is undefined (nan); it counts 0
    mean = dummy.DummyRegressor().fit(x(labels), labels).predict(x(labels))
    with pytest.warns(scipy_stats.ConstantInputWarning):
        assert math.isnan(scipy_stats.pearsonr(labels, mean)[0])
    assert known["stsb"] == 0.0


def test_without_a_data_dir_no_baseline_is_known_and_the_report_says_why():
    known, note = report.baselines(spec.sweep(name="x", scale="ci", cells={"a": {"pretrain": ["p"], "finetune": ["f"]}},
                                              tasks={"sst2": "accuracy"}, scales={"ci": {}}))
    assert known == {"sst2": None} and note == "no sweep.data_dir to read the dev labels from"


def test_dev_labels_that_cannot_be_read_leave_every_baseline_unknown_and_say_why(tmp_path):
    known, note = report.baselines(spec.sweep(name="x", scale="ci", cells={"a": {"pretrain": ["p"], "finetune": ["f"]}},
                                              tasks={"sst2": "accuracy", "rte": "accuracy"}, scales={"ci": {}},
                                              data_dir=str(tmp_path)))
    assert known == {"sst2": None, "rte": None}
    assert note.startswith("the dev labels of sst2 could not be read (") and "SST-2/dev.tsv" in note


@pytest.mark.parametrize("values, baseline", [([60.0, 62.0, 61.0], 50.9), ([52.0, 58.0], 50.9),
                                              ([48.0, 49.0, 47.5], 50.9), ([2.0, 8.0, 5.0], 0.0)])
def test_a_cell_is_at_chance_when_its_t_interval_reaches_the_baseline(values, baseline):
    low, _ = scipy_stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=scipy_stats.sem(values))
    _, ours, _ = stats.t_interval(values)
    assert stats.at_chance(ours, baseline) == (low <= baseline)
    assert not stats.at_chance(ours, None)


PAIRS = [([70.1, 68.3, 71.9, 69.4], [69.8, 68.9, 70.7, 69.0]), ([55.0, 57.5, 54.0], [50.0, 51.0, 52.5]),
         ([80.0, 81.0], [80.5, 80.2])]


@pytest.mark.parametrize("a, b", PAIRS)
@pytest.mark.parametrize("margin", [0.5, 2.0, 10.0])
def test_the_equivalence_test_is_statsmodels_paired_tost(a, b, margin):
    p, _, _ = weightstats.ttost_paired(np.array(a), np.array(b), -margin, margin)
    assert stats.tost_paired(a, b, margin) == pytest.approx(p, rel=1e-9)


@pytest.mark.parametrize("effect, sd", [(11.11, 5.51), (1.0, 5.0), (0.5, 10.0), (3.0, 1.0), (2.0, 2.0)])
def test_seeds_needed_are_statsmodels_solve_power_and_the_noncentral_t(effect, sd):
    solved = power.TTestPower().solve_power(effect_size=effect / sd, alpha=0.05, power=0.8, alternative="two-sided")
    assert stats.seeds_needed(effect, sd) == max(2, math.ceil(solved))
    n = stats.seeds_needed(effect, sd)   # re-derived: the first n whose noncentral-t power reaches 0.8
    power_at = lambda k: (scipy_stats.nct.sf(scipy_stats.t.ppf(0.975, k - 1), k - 1, effect / sd * math.sqrt(k))  # noqa: E731
                          + scipy_stats.nct.cdf(-scipy_stats.t.ppf(0.975, k - 1), k - 1, effect / sd * math.sqrt(k)))
    assert power_at(n) >= 0.8 and (n == 2 or power_at(n - 1) < 0.8)


def test_a_large_effect_needs_two_seeds_where_scipys_noncentral_t_gives_nan():
    """50 sd apart: scipy's nct (and statsmodels) give nan for the two-sided power at n = 2; 20,000 simulated 2-seed
    t-tests reject nearly always, so 2 seeds suffice."""
    critical = scipy_stats.t.ppf(0.975, 1)
    assert math.isnan(scipy_stats.nct.cdf(-critical, 1, 50 * math.sqrt(2)))   # the lower tail's half
    d = np.random.default_rng(0).normal(50.0, 1.0, (20_000, 2))
    simulated = np.mean(np.abs(d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(2))) > critical)
    assert stats.t_test_power(50.0, 2) == pytest.approx(simulated, abs=0.01)
    assert stats.seeds_needed(50.0, 1.0) == 2


def test_seed_counts_out_of_reach_or_without_spread():
    assert stats.seeds_needed(1.0, 100.0) is None   # statsmodels: about 78,500 seeds
    assert stats.seeds_needed(0.0, 1.0) is None and stats.seeds_needed(1.0, math.nan) is None
    assert stats.seeds_needed(1.0, 0.0) == 2


@pytest.mark.parametrize("margin, sd", [(1.0, 1.0), (2.0, 3.0), (0.5, 0.4)])
def test_equivalence_seeds_give_the_tost_its_power(margin, sd):
    """Each one-sided test sized for 90% (statsmodels' one-sided solve_power), so the TOST passes at
    least 80% of the time at a true difference of 0 (a simulation with statsmodels' ttost_paired)."""
    n = stats.equivalence_seeds_needed(margin, sd)
    solved = power.TTestPower().solve_power(effect_size=margin / sd, alpha=0.05, power=0.9, alternative="larger")
    assert n == max(2, math.ceil(solved))
    rng = np.random.default_rng(0)
    passed = [weightstats.ttost_paired(d, np.zeros(n), -margin, margin)[0] < 0.05
              for d in rng.normal(0.0, sd, size=(1000, n))]
    assert np.mean(passed) >= 0.8 - 3 * math.sqrt(0.16 / 1000)


@pytest.mark.parametrize("low, high, direction, verdict", [
    (0.5, 3.0, 1, "reproduced"), (-3.0, -0.5, 1, "contradicted"), (-3.0, -0.5, -1, "reproduced"),
    (0.5, 3.0, -1, "contradicted"), (-1.0, 2.0, 1, "undecided: needs 9 seeds")])
def test_difference_verdicts_read_the_interval_in_the_papers_direction(low, high, direction, verdict):
    assert stats.difference_verdict(low, high, direction, needed=9, seeds=3) == verdict


def test_undecided_says_what_is_missing():
    assert stats.undecided(None, 1) == "undecided: needs 2 seeds or more"
    assert stats.undecided(None, 3) == f"undecided: needs more than {stats.MAX_SEEDS} seeds"
    assert stats.undecided(3, 5) == "undecided: the difference is smaller than the effect 3 seeds detect"


# A report built from seeds' scores (no training): rows a, b, c on two tasks whose baselines are 50.
SCORES = {"a": {"sst2": [80.0, 82.0, 81.0, 83.0], "rte": [49.0, 53.0, 51.0, 47.0]},
          "b": {"sst2": [70.0, 73.0, 71.0, 72.5], "rte": [50.0, 48.0, 55.0, 49.0]},
          "c": {"sst2": [80.2, 81.9, 81.3, 82.6], "rte": [60.0, 61.0, 62.0, 61.5]}}


@pytest.fixture
def built(tmp_path, monkeypatch):
    cells = {name: {"pretrain": ["p.gin"], "finetune": ["f.gin"]} for name in SCORES}
    sweep_ = spec.sweep(name="toy", scale="ci", cells=cells, tasks={"sst2": "accuracy", "rte": "accuracy"},
                        scales={"ci": {"seeds": 4}}, claims=[
                            ("a > b", "a", "b", "glue_average", {"effect": 2.0}),
                            ("b > a on sst2", "b", "a", "sst2"),
                            ("a on par with c", "a", "c", "glue_average", {"margin": 2.0})])
    for name in SCORES:
        for seed in sweep_.seeds:
            folder = report.cell_dir(tmp_path, next(c for c in sweep_.cells if c.name == name), seed)
            folder.mkdir(parents=True)
            (folder / "done.json").write_text("{}")
    monkeypatch.setattr(report, "baselines", lambda s: ({"sst2": 50.0, "rte": 50.0}, None))
    monkeypatch.setattr(report, "seed_result", lambda s, folder, done: {
        "scores": {t: v[int(folder.name[-1])] for t, v in SCORES[folder.name.split("__")[0]].items()}, "cost": {}})
    return report.build(sweep_, tmp_path)


def test_at_chance_entries_are_marked_and_kept_out_of_the_average(built):
    chance = {name: cell["at_chance"] for name, cell in built["cells"].items()}
    assert chance == {"a": {"sst2": False, "rte": True}, "b": {"sst2": False, "rte": True},
                      "c": {"sst2": False, "rte": False}}
    assert built["average_tasks"] == ["sst2"]   # rte: a and b at chance
    for name, scores in SCORES.items():
        assert built["cells"][name]["summary"]["glue_average"]["mean"] == pytest.approx(np.mean(scores["sst2"]))
    text = report.markdown(built)
    rte = SCORES["a"]["rte"]
    low, high = scipy_stats.t.interval(0.95, 3, loc=np.mean(rte), scale=scipy_stats.sem(rte))
    assert "| constant baseline | 50.0 | 50.0 | – |" in text and "| a | 81.5 [" in text
    assert f"{np.mean(rte):.1f} [{low:.1f}, {high:.1f}]°" in text   # a's rte, at chance
    assert "GLUE avg is the mean over sst2: the tasks no cell is at chance on." in text


def test_verdicts_are_per_task_with_scipys_paired_test_and_statsmodels_power(built):
    ab, ba, ac = built["claims"]
    diff = np.subtract(SCORES["a"]["sst2"], SCORES["b"]["sst2"])
    low, high = scipy_stats.t.interval(0.95, 3, loc=diff.mean(), scale=scipy_stats.sem(diff))
    sst2 = ab["tasks"]["sst2"]
    np.testing.assert_allclose([sst2["difference"], sst2["low"], sst2["high"], sst2["p_value"]],
                               [diff.mean(), low, high, scipy_stats.ttest_rel(SCORES["a"]["sst2"], SCORES["b"]["sst2"]).pvalue],
                               rtol=1e-9)
    assert sst2["verdict"] == "reproduced" and ab["tasks"]["rte"]["verdict"] == "at chance: left out"
    assert sst2["seeds_needed"] == max(2, math.ceil(power.TTestPower().solve_power(
        effect_size=2.0 / np.std(diff, ddof=1), alpha=0.05, power=0.8)))   # the paper's effect, 2 points
    assert ab["verdict"] == "reproduced on sst2"
    assert ba["verdict"] == "contradicted on sst2"   # one task only: the claim's column
    # a vs c: on par on sst2 (TOST within ±2); on rte c learned and a did not (a's at chance, c's not)
    d = np.subtract(SCORES["a"]["sst2"], SCORES["c"]["sst2"])
    assert ac["tasks"]["sst2"]["tost_p_value"] == pytest.approx(weightstats.ttost_paired(
        np.array(SCORES["a"]["sst2"]), np.array(SCORES["c"]["sst2"]), -2.0, 2.0)[0], rel=1e-9)
    assert ac["tasks"]["sst2"]["verdict"] == "reproduced" and ac["tasks"]["rte"]["verdict"] == "contradicted"
    assert ac["verdict"] == "mixed: reproduced on sst2; contradicted on rte"
    assert np.std(d, ddof=1) > 0


def test_the_report_rebuilds_its_claim_tables_from_its_json(built, tmp_path):
    """report.json (NaN as null, keys sorted, so tasks in name order) renders the rows the report
    built in memory does."""
    from t5lite.experiments.runner import write_json_atomic
    write_json_atomic(tmp_path / "r.json", built)
    again = json.loads((tmp_path / "r.json").read_text())
    assert sorted(report.claim_table(again)) == sorted(report.claim_table(built))
    assert any("| a > b | sst2 | 50.0 | 81.5 | 71.6 |" in line for line in report.claim_table(built))
