"""`benchmarks/long_attention.py --dry_run`: both attentions timed and measured at tiny lengths, the
table printed, the JSON and the plot written."""
import json

from conftest import load_benchmark


def test_long_attention_dry_run_writes_its_table_json_and_plot(tmp_path, capsys):
    benchmark = load_benchmark("long_attention")
    rows = benchmark.main(["--dry_run", "--out", str(tmp_path)])
    assert [r["length"] for r in rows] == [32, 64]
    assert all(r[f"{kind}_{unit}"] > 0 for r in rows for kind in ("full", "windowed") for unit in ("ms", "mib"))
    assert "| length | full ms | windowed ms | full MiB | windowed MiB |" in capsys.readouterr().out
    assert json.loads((tmp_path / "long_attention.json").read_text())["rows"] == rows
    assert (tmp_path / "long_attention.png").stat().st_size > 0
