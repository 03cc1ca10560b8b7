"""The cost report: Strubell et al.'s formula by hand, the device table, and cost.json beside
metrics.jsonl through a resume."""
from __future__ import annotations

import json

import pytest
from conftest import assert_close, train_tiny

from t5lite import models
from t5lite.errors import ConfigError
from t5lite.train import cost


def _strubell_eq1_kwh(t, p_c, p_r, g, p_g):
    """Strubell, Ganesh and McCallum (2019), "Energy and Policy Considerations for Deep Learning in
    NLP", section 2, eq. 1: p_t = 1.58 t (p_c + p_r + g p_g) / 1000 (kWh; t hours, average power of
    all CPU sockets p_c, of all DRAM p_r, and of each of g GPUs p_g, in W)."""
    return 1.58 * t * (p_c + p_r + g * p_g) / 1000


# Strubell et al. (2019), Table 3: (model, power W = p_c + p_r + g p_g, hours, kWh-PUE, CO2e lbs).
# BERT_base on V100x64 (12,041.51 W, 79 h, 1507 kWh) is left out: its hours are rounded (1507 kWh is 79.2 h).
TABLE_3 = [("Transformer_base", 1415.78, 12, 27, 26), ("Transformer_big", 1515.43, 84, 201, 192),
           ("ELMo", 517.66, 336, 275, 262), ("NAS", 1515.43, 274_120, 656_347, 626_155)]


def test_the_estimate_is_strubells_eq_1_with_cpu_and_dram_power():
    model = cost.CostModel("TPU v3", devices=8, device_power_watts=141.5, pue=1.58, grid_kg_co2e_per_kwh=0.4327,
                           price_per_device_hour=1.0, source="test", cpu_power_watts=205.0, dram_power_watts=38.0)
    got = model.estimate(flops=3e18, seconds=2 * 3600)
    assert got["flops"] == 3e18
    assert_close(got["device_hours"], 16.0)
    assert_close(got["energy_kwh"], _strubell_eq1_kwh(2, 205.0, 38.0, 8, 141.5))
    assert_close(got["co2e_kg"], got["energy_kwh"] * 0.4327)
    assert_close(got["usd"], 16.0)
    # each host brings its own CPUs and memory
    two_hosts = cost.CostModel("TPU v3", 16, 141.5, 1.58, 0.4327, 1.0, "test", 205.0, 38.0, hosts=2)
    assert_close(two_hosts.estimate(0, 3600)["energy_kwh"], _strubell_eq1_kwh(1, 2 * 205.0, 2 * 38.0, 16, 141.5))
    # Strubell et al.'s defaults: PUE 1.58 and 0.954 lbs CO2e per kWh.
    assert cost.DEFAULT_PUE == 1.58
    assert_close(cost.DEFAULT_GRID, 0.954 * 0.45359237, rtol=1e-4)


@pytest.mark.parametrize("name,watts,hours,kwh,co2e_lbs", TABLE_3)
def test_strubells_table_3_rows_are_reproduced(name, watts, hours, kwh, co2e_lbs):
    """The paper's kWh-PUE and CO2e (lbs), to the unit it prints, from its power and hours; the
    paper gives the sum only, here split between one GPU, the CPU and DRAM."""
    model = cost.CostModel("gpu", 1, watts - 100.0, cost.DEFAULT_PUE, cost.DEFAULT_GRID, 0.0, "test",
                           cpu_power_watts=70.0, dram_power_watts=30.0)
    got = model.estimate(0, hours * 3600)
    assert round(got["energy_kwh"]) == kwh == round(_strubell_eq1_kwh(hours, 70.0, 30.0, 1, watts - 100.0))
    assert round(got["co2e_kg"] / 0.45359237) == co2e_lbs


def test_host_cpu_and_dram_default_to_green_algorithms_figures_for_this_machine():
    """12 W per core and 0.3725 W per GB of memory (Lannelongue et al. 2021, Green Algorithms'
    defaults), this machine's cores and memory (/proc/meminfo's MemTotal); the CPU backend's device
    draws 0 so the CPU is counted once; gin settings win."""
    import os
    with open("/proc/meminfo") as f:
        mem_bytes = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    model = cost.cost_model(device_kind="cpu", devices=1)
    assert_close(model.cpu_power_watts, 12.0 * os.cpu_count())
    assert_close(model.dram_power_watts, 0.3725 * mem_bytes / 1e9, rtol=1e-3)
    assert model.device_power_watts == 0.0 and "Green Algorithms" in model.source
    got = model.estimate(0, 3600)["energy_kwh"]
    assert_close(got, _strubell_eq1_kwh(1, 12.0 * os.cpu_count(), 0.3725 * mem_bytes / 1e9, 1, 0.0), rtol=1e-3)
    configured = cost.cost_model(device_kind="TPU v4", devices=4, cpu_power_watts=300.0, dram_power_watts=50.0)
    assert (configured.cpu_power_watts, configured.dram_power_watts, configured.hosts) == (300.0, 50.0, 1)
    with pytest.raises(ConfigError, match="cost.dram_power_watts"):
        cost.cost_model(device_kind="cpu", dram_power_watts=-1.0)


def test_device_defaults_are_looked_up_by_device_kind_and_gin_settings_win():
    assert cost.lookup("TPU v4") is cost.DEVICES["tpu v4"]
    assert cost.lookup("TPU v5 lite") is cost.DEVICES["tpu v5 lite"]     # not v5p's row
    assert cost.lookup("NVIDIA H100 80GB HBM3") is cost.DEVICES["nvidia h100"]
    assert cost.lookup("NVIDIA A100-SXM4-40GB") is cost.DEVICES["nvidia a100"]
    with pytest.raises(ConfigError, match="cost.device_power_watts"):
        cost.lookup("Some accelerator")
    configured = cost.cost_model(device_power_watts=300.0, price_per_device_hour=2.0, device_kind="Some accelerator",
                                 devices=4)
    assert (configured.device_power_watts, configured.price_per_device_hour, configured.devices) == (300.0, 2.0, 4)
    unknown = cost.cost_model(device_kind="Some accelerator")    # the run goes on; the estimate says why it is 0
    assert (unknown.device_power_watts, unknown.price_per_device_hour) == (0.0, 0.0)
    assert "cost.device_power_watts" in unknown.source
    half = cost.cost_model(device_power_watts=50.0, device_kind="TPU v4")
    assert half.device_power_watts == 50.0 and half.price_per_device_hour == cost.DEVICES["tpu v4"].price_per_hour
    with pytest.raises(ConfigError, match="cost.pue"):
        cost.cost_model(pue=-1.0, device_kind="cpu")


def test_cost_json_matches_metrics_jsonl_and_a_resume_continues_the_totals(tmp_path):
    config = models.get_config("t5_tiny")
    train_tiny(tmp_path, config, 2)
    first = json.loads((tmp_path / "cost.json").read_text())
    train_tiny(tmp_path, config, 4)          # resumes from the step-2 checkpoint
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    final = json.loads((tmp_path / "cost.json").read_text())
    assert [r["step"] for r in records] == [1, 2, 3, 4] and final["step"] == 4
    for key in ("flops", "device_hours", "energy_kwh", "co2e_kg", "usd", "seconds"):
        assert final[key] == records[-1][f"cost_{key}"], key
    per_step = records[0]["cost_flops"]
    assert per_step > 0
    assert_close([r["cost_flops"] for r in records], [per_step * r["step"] for r in records])
    # The second run starts from the first one's totals: its time adds to theirs.
    assert records[2]["cost_seconds"] > first["seconds"] == records[1]["cost_seconds"]
    hours = final["seconds"] / 3600
    assert_close(final["energy_kwh"], _strubell_eq1_kwh(
        hours, final["hosts"] * final["cpu_power_watts"], final["hosts"] * final["dram_power_watts"],
        final["devices"], final["device_power_watts"]))
    assert_close(final["co2e_kg"], final["energy_kwh"] * final["grid_kg_co2e_per_kwh"])
    assert_close(final["usd"], final["price_per_device_hour"] * final["devices"] * hours)


def test_t5lite_eval_writes_cost_json_beside_its_metrics(tmp_path, capsys):
    """`t5lite eval` writes the cost of its own call to `<run>/eval/cost.json` (training's schema)
    and adds it to each metrics line; the fields are Strubell's formula recomputed here."""
    import gin

    from conftest import TINY_LENGTHS, TINY_TASK
    from t5lite import cli
    train_tiny(tmp_path, models.get_config("t5_tiny"), 2)
    training = json.loads((tmp_path / "cost.json").read_text())
    gin.clear_config()
    cli.main(["eval", f"--gin.CHECKPOINT_PATH='{tmp_path}'", f"--gin.MIXTURE_OR_TASK_NAME='{TINY_TASK}'",
              f"--gin.TASK_FEATURE_LENGTHS={TINY_LENGTHS}", "--gin.eval.max_examples=4",
              "--gin.cost.device_power_watts=250.0", "--gin.cost.price_per_device_hour=3.0", "--gin.cost.pue=1.1"])
    assert "cost (estimated):" in capsys.readouterr().out
    got = json.loads((tmp_path / "eval" / "cost.json").read_text())
    assert set(got) == set(training) - {"step"}
    assert json.loads((tmp_path / "cost.json").read_text()) == training     # the training run's own stays
    assert (got["device_power_watts"], got["price_per_device_hour"], got["pue"]) == (250.0, 3.0, 1.1)
    assert 0 < got["seconds"] < 600
    device_hours = got["devices"] * got["seconds"] / 3600
    energy = 1.1 * got["seconds"] / 3600 * (got["hosts"] * (got["cpu_power_watts"] + got["dram_power_watts"])
                                            + got["devices"] * 250.0) / 1000
    assert_close(got["device_hours"], device_hours)
    assert_close(got["energy_kwh"], energy)
    assert_close(got["co2e_kg"], energy * cost.DEFAULT_GRID)
    assert_close(got["usd"], 3.0 * device_hours)
    assert got["flops"] > 0           # counted in test_t5lite_eval_counts_the_forward_flops_it_ran
    line = json.loads((tmp_path / "eval" / f"{TINY_TASK}.validation" / "metrics.jsonl").read_text().splitlines()[-1])
    assert {k: line[f"cost_{k}"] for k in ("flops", "device_hours", "energy_kwh", "co2e_kg", "usd", "seconds")} == \
        {k: got[k] for k in ("flops", "device_hours", "energy_kwh", "co2e_kg", "usd", "seconds")}


def _kernel_macs(config, per_token) -> float:
    """Sum of each matmul kernel's size (the config's model, built here) times the tokens it
    multiplies (`per_token(name)`); the token embedding counts as the tied LM head."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    features = {k: jnp.ones((1, 4), jnp.int32) for k in ("encoder_input_tokens", "decoder_input_tokens")
                if config.arch != "encoder" or k.startswith("encoder")}
    params = nn.unbox(jax.eval_shape(lambda: models.build(config).init(jax.random.key(0), **features)))["params"]
    names = [(jax.tree_util.keystr(path), leaf.size) for path, leaf in jax.tree_util.tree_leaves_with_path(params)]
    return sum(size * per_token(name) for name, size in names
               if name.endswith("['kernel']") or name == "['token_embedder']['embedding']")


def _t5_forward_by_hand(cfg, n_in, n_out) -> float:
    """2 x the parameter matmuls' MACs (encoder kernels over the inputs; decoder kernels over the
    outputs, but cross-attention keys and values over the inputs; the tied embedding as the LM head
    over the outputs) + 2 x the attention matmuls QK^T and AV: n_in^2 x width both per encoder
    layer, n_out^2 / 2 x width both (causal) and n_out x n_in x width both (cross) per decoder layer."""
    def tokens(name):
        if name.startswith("['encoder']") or "cross_attention']['key" in name or "cross_attention']['value" in name:
            return n_in
        return n_out
    width = cfg.num_heads * cfg.head_dim
    attention = (cfg.num_encoder_layers * 2 * n_in * n_in * width
                 + cfg.num_decoder_layers * (2 * n_out * n_out * width / 2 + 2 * n_out * n_in * width))
    return 2 * (_kernel_macs(cfg, tokens) + attention)


def _spy_forward_calls(monkeypatch, config) -> list:
    """(input length, output length) of each example of every target scoring and greedy decoding
    call from now on (greedy: up to and including EOS), read from the arrays each call saw."""
    import numpy as np

    from t5lite.infer import decoding, scoring
    calls = []
    score, greedy = scoring.target_log_likelihood, decoding.greedy

    def spy_score(module, params, inputs, targets, lengths=None):
        calls.extend(zip(np.count_nonzero(inputs["encoder_input_tokens"], axis=1), np.asarray(lengths)))
        return score(module, params, inputs, targets, lengths)

    def spy_greedy(module, params, inputs, **kwargs):
        out = greedy(module, params, inputs, **kwargs)
        tokens = np.asarray(out.tokens)
        is_eos = tokens == config.eos_token_id
        generated = np.where(is_eos.any(1), is_eos.argmax(1) + 1, tokens.shape[1])
        calls.extend(zip(np.count_nonzero(inputs["encoder_input_tokens"], axis=1), generated))
        return out
    monkeypatch.setattr(scoring, "target_log_likelihood", spy_score)
    monkeypatch.setattr(decoding, "greedy", spy_greedy)
    return calls


def test_t5lite_eval_counts_the_forward_flops_it_ran(tmp_path, monkeypatch):
    """Text-to-text eval of a t5_tiny run on SST-2: scoring the target, greedy decoding (up to EOS:
    a KV-cache step is one token's forward) and scoring each label each run the model once per
    example; cost.json's flops are their sum, re-derived by hand from the lengths each call saw."""
    import gin

    from conftest import shared_data_dir
    from t5lite import cli
    config = models.get_config("t5_tiny")
    train_tiny(tmp_path, config, 1)
    calls = _spy_forward_calls(monkeypatch, config)
    gin.clear_config()
    cli.main(["eval", f"--gin.CHECKPOINT_PATH='{tmp_path}'", "--gin.MIXTURE_OR_TASK_NAME='glue_sst2'",
              "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 8}", "--gin.eval.max_examples=3",
              "--gin.eval.batch_size=1", f"--gin.eval.data_dir='{shared_data_dir() / 'glue'}'"])
    gin.clear_config()
    assert len(calls) == 3 * 4        # per example: the target, the decode, two labels
    expected = sum(_t5_forward_by_hand(config, int(i), int(o)) for i, o in calls)
    got = json.loads((tmp_path / "eval" / "cost.json").read_text())["flops"]
    assert got == pytest.approx(expected, rel=1e-9)


def test_t5lite_eval_of_a_task_head_counts_the_encoder_it_ran(bert_tiny_sst2_run, tmp_path, monkeypatch):
    """A bert_tiny SST-2 classifier: the encoder over each example's tokens, padding and the filler
    rows of a short batch left out, and neither the MLM head (it does not run) nor the d_model x 2
    classifier counted: 2 x (layer kernels x tokens) + 2 x 2 x n^2 x width per layer."""
    import gin
    import numpy as np

    from conftest import shared_data_dir
    from t5lite import cli
    from t5lite.infer import classify, predict
    seen = []
    apply = classify._apply

    def spy(module, params, inputs):
        seen.extend(np.count_nonzero(inputs["encoder_input_tokens"], axis=1))
        return apply(module, params, inputs)
    monkeypatch.setattr(classify, "_apply", spy)
    gin.clear_config()
    cli.main(["eval", "--gin_file=configs/local/bert_tiny_finetune_sst2.gin",
              f"--gin.CHECKPOINT_PATH='{bert_tiny_sst2_run}'", f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'",
              "--gin.eval.max_examples=5", "--gin.eval.batch_size=4", f"--gin.eval.output_dir='{tmp_path}'"])
    gin.clear_config()
    lengths = [int(n) for n in seen if n]
    assert len(lengths) == 5 and len(seen) > 5       # the filler rows ran, but are no examples
    config = models.get_config("bert_tiny")
    width = config.num_heads * config.head_dim
    layer_macs = _kernel_macs(predict.model_config_of(bert_tiny_sst2_run, None),
                              lambda name: "['encoder']['layers_" in name)   # per token
    expected = sum(2 * (layer_macs * n + config.num_encoder_layers * 2 * n * n * width) for n in lengths)
    got = json.loads((tmp_path / "cost.json").read_text())["flops"]
    assert got == pytest.approx(expected, rel=1e-9)


def test_training_counts_its_evaluations_forward_flops_through_a_resume(tmp_path, monkeypatch):
    """A t5_tiny SST-2 run evaluating every 2 steps, then resumed to step 3 (its final eval):
    cost.json's flops are the 3 steps' (3 x the FLOPs logged at step 1, before any eval) plus both
    evals' forward passes, re-derived by hand from the lengths each call saw, counted once."""
    from conftest import shared_data_dir
    config = models.get_config("t5_tiny")
    calls = _spy_forward_calls(monkeypatch, config)
    sst2 = dict(mixture_or_task_name="glue_sst2", task_feature_lengths={"inputs": 32, "targets": 4},
                data_dir=str(shared_data_dir() / "glue"), eval_every=2, eval_max_examples=2, eval_batch_size=1)
    train_tiny(tmp_path, config, 2, **sst2)     # evaluates at step 2
    first = json.loads((tmp_path / "cost.json").read_text())
    train_tiny(tmp_path, config, 3, **sst2)     # resumes from step 2, evaluates at step 3
    assert len(calls) == 2 * 2 * 4              # 2 evals x 2 examples x (target, decode, two labels)
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    per_step = records[0]["cost_flops"]
    assert records[0]["step"] == 1 and per_step > 0
    evals = [sum(_t5_forward_by_hand(config, int(i), int(o)) for i, o in part)
             for part in (calls[:8], calls[8:])]
    assert first["flops"] == pytest.approx(2 * per_step + evals[0], rel=1e-9)
    final = json.loads((tmp_path / "cost.json").read_text())
    assert final["flops"] == pytest.approx(3 * per_step + sum(evals), rel=1e-9)
    last_eval = [r for r in records if "eval_accuracy" in r][-1]
    assert last_eval["step"] == 3 and last_eval["cost_flops"] == final["flops"]


@pytest.mark.parametrize("task,lengths,data", [("sentence_stsb", {"text0": 32, "text1": 32}, "glue"),
                                               ("sentence_squad_v1", {"text0": 16, "text1": 48}, "squad/v1.1")])
def test_sentence_evaluation_counts_the_encoder_over_each_text_it_embeds(task, lengths, data):
    """A bert_tiny bi-encoder: STS-B similarity embeds both texts of each pair, SQuAD retrieval
    every question and each distinct paragraph once; each is the encoder over its own tokens,
    2 x (layer kernels x tokens) + 2 x 2 x n^2 x width per layer (no MLM head, no pooling)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from conftest import shared_data_dir
    from t5lite.data import catalog
    from t5lite.infer.embedding import SentenceEvaluator
    from t5lite.models.sentence import BiEncoder
    config = models.get_config("bert_tiny", vocab_size=2176)
    module = BiEncoder(config)
    params = nn.unbox(module.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32)))["params"]
    evaluator = SentenceEvaluator(catalog.get_task_or_mixture(task), "validation", lengths, batch_size=4,
                                  data_dir=str(shared_data_dir() / data), max_examples=6)
    result = evaluator.evaluate(module, params)
    texts = {"text0": [ex["text0"] for ex in evaluator.examples]}
    if evaluator.similarity:
        texts["text1"] = [ex["text1"] for ex in evaluator.examples]
    else:
        texts["text1"] = list({ex["text1_pretokenized"]: ex["text1"] for ex in evaluator.examples}.values())
        assert len(texts["text1"]) < len(evaluator.examples)     # questions share paragraphs
    width = config.num_heads * config.head_dim
    layer_macs = _kernel_macs(config, lambda name: "['encoder']['layers_" in name)   # per token
    expected = sum(2 * (layer_macs * len(row) + config.num_encoder_layers * 2 * len(row) ** 2 * width)
                   for rows in texts.values() for row in rows)
    assert result.flops == pytest.approx(expected, rel=1e-9)
