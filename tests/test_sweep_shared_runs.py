"""Sweep cells that own no pre-training of their own: one fine-tuned from another cell's pre-training
(`pretrain_from`: ULMFiT's encoder trained two ways, pre-trained once per seed), and one whose probe
lens reads a model the sweep does not train (`probe_model`: GloVe's vectors beside ELMo's layers).
Through tests/sweep_fake_cli.py."""
import json

import pytest

from conftest import REPO
from test_sweep import sweep, write_sweep
from test_sweep_lenses import PROBE_LENS

from t5lite.errors import ConfigError

ONE_START = (r"give at most one of 'pretrain_from' \(a cell\), 'start_from' \(a checkpoint\) or 'probe_model' "
             r"\(a path\), each with 'pretrain': \[\] and as a string")

# The dependent cell comes first in the file: the runner must still start it after its source.
SHARED = """
sweep.cells = {
    'reuse': {'pretrain': [], 'pretrain_from': 'good_enc_dec', 'finetune': ['configs/local/t5_tiny_finetune_sst2.gin'],
              'finetune_bindings': ['train.seed = 7']},
    'good_enc_dec': {'pretrain': ['configs/local/t5_tiny_pretrain.gin'], 'tokens_per_row': 160,
                     'finetune': ['configs/local/t5_tiny_finetune_sst2.gin']},
}
sweep.claims = [('the same encoder, fine-tuned two ways', 'good_enc_dec', 'reuse', 'sst2')]
"""


def shared_sweep(tmp_path, cells=SHARED):
    gin_file = write_sweep(tmp_path)
    gin_file.write_text(gin_file.read_text() + cells)
    return gin_file


def test_a_cell_fine_tunes_from_its_sources_finished_pretraining_of_the_same_seed(tmp_path):
    out = tmp_path / "out"
    result = sweep(shared_sweep(tmp_path), out, env={"FAKE_STEP_SECONDS": "0.2"})   # a pre-training takes 0.8 s
    assert result.returncode == 0, result.stderr
    steps = 2560 // (4 * 160)   # the ci scale's budget, batch 4, 160 tokens a row
    for seed in (0, 1):
        assert not (out / f"reuse__seed{seed}" / "pretrain").exists()
        for task in ("sst2", "rte"):
            started = json.loads((out / f"reuse__seed{seed}" / f"finetune_{task}" / "started_from.json").read_text())
            assert started == {"path": str(out / f"good_enc_dec__seed{seed}" / "pretrain"), "steps_logged": steps}
    report = json.loads((out / "report.json").read_text())
    assert len(report["cells"]["reuse"]["seeds"]) == 2 and report["claims"][0]["tasks"].keys() == {"sst2"}


def test_a_cell_run_alone_without_its_source_is_one_line(tmp_path):
    out = tmp_path / "out"
    result = sweep(shared_sweep(tmp_path), out, "--cells", "reuse")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "cell 'reuse' fine-tunes from 'good_enc_dec''s pre-training; add good_enc_dec" in result.stderr
    assert sweep(shared_sweep(tmp_path), out, "--cells", "reuse,good_enc_dec").returncode == 0
    assert len(list(out.glob("*/done.json"))) == 4


def test_a_pilot_keeps_the_cell_a_compared_cell_fine_tunes_from(tmp_path, clean_gin_state):
    from t5lite.experiments import spec
    cells = SHARED.replace("sweep.claims = [('the same encoder, fine-tuned two ways', 'good_enc_dec', 'reuse', 'sst2')]",
                           "sweep.claims = [('pre-trained beats scratch', 'reuse', 'scratch', 'sst2')]").replace(
        "sweep.cells = {", "sweep.cells = {\n    'scratch': {'pretrain': [], 'finetune': ['configs/local/t5_tiny_finetune_sst2.gin']},")
    pilot = spec.pilot(spec.load([str(shared_sweep(tmp_path, cells))], [], [str(REPO)]))
    assert sorted(c.name for c in pilot.cells) == ["good_enc_dec", "reuse", "scratch"]


@pytest.mark.parametrize("cell, message", [
    ("'pretrain_from': 'nobody'", r"'pretrain_from' names a cell that pre-trains \(good_enc_dec\)"),
    ("'pretrain_from': 'reuse'", r"'pretrain_from' names a cell that pre-trains \(good_enc_dec\)"),
])
def test_a_bad_pretrain_from_is_one_line(tmp_path, clean_gin_state, cell, message):
    from t5lite.experiments import spec
    gin_file = shared_sweep(tmp_path, SHARED.replace("'pretrain_from': 'good_enc_dec'", cell))
    with pytest.raises(ConfigError, match=message):
        spec.load([str(gin_file)], [], [str(REPO)])


def test_a_pretrained_cell_with_pretrain_from_is_refused(tmp_path, clean_gin_state):
    from t5lite.experiments import spec
    cells = SHARED.replace("'reuse': {'pretrain': []", "'reuse': {'pretrain': ['configs/local/t5_tiny_pretrain.gin']")
    with pytest.raises(ConfigError, match=ONE_START):
        spec.load([str(shared_sweep(tmp_path, cells))], [], [str(REPO)])


def probed_sweep(tmp_path, key, path, name="static"):
    """A pre-trained cell and `name`, which pre-trains nothing and has `key` (start_from or
    probe_model) = `path`, with the POS probe lens and a claim on it."""
    cells = f"""
sweep.cells = {{
    'good_enc_dec': {{'pretrain': ['configs/local/t5_tiny_pretrain.gin'], 'tokens_per_row': 160,
                     'finetune': ['configs/local/t5_tiny_finetune_sst2.gin']}},
    '{name}': {{'pretrain': [], '{key}': '{path}', 'finetune': ['configs/local/t5_tiny_finetune_sst2.gin']}},
}}
sweep.claims = [('ours tags better', 'good_enc_dec', '{name}', 'pos')]
"""
    return shared_sweep(tmp_path, PROBE_LENS + cells)


def vectors_sweep(tmp_path, vectors):
    return probed_sweep(tmp_path, "probe_model", vectors)


def start_from_sweep(tmp_path, base):
    return probed_sweep(tmp_path, "start_from", base, name="released")


def test_a_cell_without_pretraining_is_probed_as_its_probe_model(tmp_path):
    vectors = tmp_path / "vectors" / "glove.txt"
    vectors.parent.mkdir()
    vectors.write_text("the 0.1 0.2\n")
    out = tmp_path / "out"
    result = sweep(vectors_sweep(tmp_path, vectors), out)
    assert result.returncode == 0, result.stderr
    for seed in (0, 1):
        probed = json.loads((out / f"static__seed{seed}" / "probe_pos" / "probe.json").read_text())
        assert probed["model"] == "static" and not (out / f"static__seed{seed}" / "pretrain").exists()
    report = json.loads((out / "report.json").read_text())
    assert report["probe_models"] == {"static": str(vectors)}
    # the fake probe scores a model by the name of its folder: 'vectors' is not a good* cell's
    assert 80 <= report["cells"]["static"]["summary"]["pos"]["mean"] < 81
    assert report["claims"][0]["tasks"]["pos"]["verdict"].startswith("reproduced")
    assert f"(static, which pre-trains nothing: {vectors})" in (out / "report.md").read_text()


@pytest.mark.parametrize("key", ["probe_model", "start_from"])
def test_a_missing_probe_model_or_start_from_stops_the_sweep_before_any_run(tmp_path, key):
    result = sweep(probed_sweep(tmp_path, key, tmp_path / "nowhere"), tmp_path / "out")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"cell 'static': its {key} {tmp_path / 'nowhere'} does not exist" in result.stderr
    assert not list((tmp_path / "out").glob("*__seed*"))


def test_a_probe_model_is_only_for_a_cell_without_pretraining(tmp_path, clean_gin_state):
    from t5lite.experiments import spec
    gin_file = vectors_sweep(tmp_path, "x.txt")
    gin_file.write_text(gin_file.read_text().replace("'static': {'pretrain': []", "'static': {'pretrain': ['configs/local/t5_tiny_pretrain.gin']"))
    with pytest.raises(ConfigError, match=ONE_START):
        spec.load([str(gin_file)], [], [str(REPO)])


def test_a_cell_fine_tunes_and_is_probed_from_its_start_from_checkpoint(tmp_path):
    base = tmp_path / "released_model"
    base.mkdir()
    out = tmp_path / "out"
    assert sweep(start_from_sweep(tmp_path, base), out).returncode == 0
    for seed in (0, 1):
        folder = out / f"released__seed{seed}"
        assert not (folder / "pretrain").exists()
        for task in ("sst2", "rte"):
            assert json.loads((folder / f"finetune_{task}" / "started_from.json").read_text())["path"] == str(base)
        assert json.loads((folder / "probe_pos" / "probe.json").read_text())["model"] == "released"
    report = json.loads((out / "report.json").read_text())
    assert not any(r["scores"]["pos"] != r["scores"]["pos"] for r in report["cells"]["released"]["seeds"].values())


def test_two_starting_points_for_one_cell_are_refused(tmp_path, clean_gin_state):
    from t5lite.experiments import spec
    gin_file = start_from_sweep(tmp_path, "x")
    gin_file.write_text(gin_file.read_text().replace("'start_from': 'x'", "'start_from': 'x', 'probe_model': 'y'"))
    with pytest.raises(ConfigError, match=ONE_START):
        spec.load([str(gin_file)], [], [str(REPO)])
