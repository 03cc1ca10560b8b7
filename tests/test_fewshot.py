"""Few-shot in-context evaluation: prompts hold k seeded demonstrations that are never the query,
rank classification picks HF GPT-2's most likely continuation, free generation is HF's greedy
continuation, and a prompt too long for the model loses its start."""
import numpy as np
import pytest

from t5lite.errors import ConfigError, DataError
from t5lite.infer.fewshot import FewShot, cut_generation, format_prompt

POOL = [(f"train input {i}", f"label{i % 2}") for i in range(30)] + [("the query", "label1")] * 3


def _demonstrations(prompt, separator="\n"):
    lines = prompt.split(separator)
    return [tuple(line.split(" -> ")) for line in lines[:-1]], lines[-1]


def test_prompts_hold_k_seeded_demonstrations_never_the_query():
    queries = ["the query", "another query", "train input 4"]
    prompts = FewShot(k=4, seed=3).prompts(queries, POOL)
    assert prompts == FewShot(k=4, seed=3).prompts(queries, POOL)     # seeded
    assert prompts != FewShot(k=4, seed=4).prompts(queries, POOL)
    for query, prompt in zip(queries, prompts):
        demos, last = _demonstrations(prompt)
        assert last == f"{query} ->" and len(demos) == 4 and len(set(demos)) == 4
        assert all(d in POOL and d[0] != query for d in demos)
    for seed in range(50):   # the query is 3 of the 33 pool entries: never drawn
        demos, _ = _demonstrations(FewShot(k=10, seed=seed).prompts(["the query"], POOL)[0])
        assert all(x != "the query" for x, _ in demos)
    assert FewShot(k=0).prompts(["q"], POOL) == ["q ->"]
    assert format_prompt([("a", "b")], "c", " | ") == "a -> b | c ->"


def test_bad_settings_fail_naming_them():
    with pytest.raises(DataError, match="FewShot.k=31 .* only 30 examples other than the query"):
        FewShot(k=31).prompts(["the query"], POOL)
    with pytest.raises(ConfigError, match="FewShot.k=-1"):
        FewShot(k=-1)


def test_generation_is_cut_at_the_separator():
    assert cut_generation(" positive\nsst2 sentence: x", "\n") == "positive"
    assert cut_generation(" positive | next", " | ") == "positive"


def test_rank_choice_and_generation_are_hf_gpt2s_on_left_truncated_prompts(tmp_path):
    torch = pytest.importorskip("torch", reason="HF comparisons need the optional torch dependency (extras 'hf')")
    transformers = pytest.importorskip("transformers", reason="HF comparisons need transformers (extras 'hf')")
    from t5lite.interop import hf
    from word_task import LABELS, WordVocab, hf_log_likelihood, hf_model, word_task

    model = hf_model(torch, transformers, "gpt2")
    model.save_pretrained(tmp_path)
    module, variables = hf.load(str(tmp_path))
    vocab = WordVocab(module.config.pad_token_id, module.config.eos_token_id)
    fewshot = FewShot(k=3, max_length=24)     # labels are one word: answers of 2 tokens, prompts of 22
    with word_task("fewshot_test_guess", vocab) as task:
        result = fewshot.evaluate(task, "validation", module, variables["params"], batch_size=4)
        gold = [ex["targets_pretokenized"] for ex in task.get_dataset("validation")]
    assert len(result.predictions) == 10
    truncated = 0
    for record in result.predictions:
        ids = vocab.encode(record["prompt"])
        truncated += len(ids) > 22
        ids = ids[-22:]
        scores = [hf_log_likelihood(torch, "gpt2", model, ids, vocab.encode(" " + label)) for label in LABELS]
        assert sorted(scores)[-1] - sorted(scores)[-2] > 1e-3, "labels should not tie"
        assert record["score_prediction"] == LABELS[int(np.argmax(scores))]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=2, do_sample=False, eos_token_id=vocab.eos_id,
                                 pad_token_id=vocab.eos_id)[0, len(ids):].tolist()
        assert record["prediction"] == vocab.decode(out[:out.index(vocab.eos_id)] if vocab.eos_id in out else out)
    assert truncated >= 5, "most prompts should exceed the budget"
    chosen = [r["score_prediction"] for r in result.predictions]
    assert len(set(chosen)) > 1
    assert result.metrics["score_accuracy"] == pytest.approx(100 * np.mean(np.array(chosen) == np.array(gold)))
    generated = [r["prediction"] for r in result.predictions]
    assert result.metrics["accuracy"] == pytest.approx(100 * np.mean(np.array(generated) == np.array(gold)))
