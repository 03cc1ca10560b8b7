"""ListOps as Long Range Arena generates it: t5lite.data.listops against LRA's generator, transcribed
below from google-research/long-range-arena `lra_benchmarks/data/listops.py` (`generate_tree`,
`to_string`, `to_value`, and `main`'s length filter), with a `random.Random` in place of the module
`random`; values checked by a stack evaluator of the token string that never sees a tree; the
`listops` and `listops_1k` tasks; configs/local/listops_longformer.gin for a few steps."""
import collections
import json
import os
import random

import numpy as np
import pytest
from conftest import REPO

from t5lite import cli
from t5lite.data import catalog, listops
from t5lite.data.tasks import listops as listops_tasks

scipy_stats = pytest.importorskip("scipy.stats", reason="the distribution tests' statistics (extra 'metrics')")

# --- LRA's generator, transcribed (lra_benchmarks/data/listops.py) -------------------------------
LRA_MIN, LRA_MAX, LRA_MED, LRA_SUM_MOD, LRA_END = "[MIN", "[MAX", "[MED", "[SM", "]"
LRA_OPERATORS = [LRA_MIN, LRA_MAX, LRA_MED, LRA_SUM_MOD]
LRA_VALUES = range(10)
LRA_VALUE_P = 0.25


def lra_generate_tree(rng, depth, max_depth, max_args):
    if depth < max_depth:
        r = rng.random()
    else:
        r = 1
    if r > LRA_VALUE_P:
        return rng.choice(LRA_VALUES), 1
    length = 2
    num_values = rng.randint(2, max_args)
    values = []
    for _ in range(num_values):
        sub_t, sub_l = lra_generate_tree(rng, depth + 1, max_depth, max_args)
        values.append(sub_t)
        length += sub_l
    op = rng.choice(LRA_OPERATORS)
    t = (op, values[0])
    for value in values[1:]:
        t = (t, value)
    return (t, LRA_END), length


def lra_to_string(t):
    if isinstance(t, str):
        return t
    if isinstance(t, int):
        return str(t)
    return "( " + lra_to_string(t[0]) + " " + lra_to_string(t[1]) + " )"


def lra_to_value(t):
    if not isinstance(t, tuple):
        return t
    left, right = lra_to_value(t[0]), lra_to_value(t[1])
    if left in LRA_OPERATORS:
        return (left, [right])
    if right == LRA_END:
        op, args = left
        return {LRA_MIN: min, LRA_MAX: max, LRA_MED: lambda a: int(np.median(a)),
                LRA_SUM_MOD: lambda a: np.sum(a) % 10}[op](args)
    return (left[0], left[1] + [right])


def lra_draw(rng, min_length, max_length, max_depth=10, max_args=10):
    """`main`'s loop: trees drawn until min_length < length < max_length."""
    while True:
        tree, length = lra_generate_tree(rng, 1, max_depth, max_args)
        if min_length < length < max_length:
            return tree, length
# -------------------------------------------------------------------------------------------------


def stack_value(tokens):
    """The value of a token string read left to right with a stack of open operators (parentheses
    carry no meaning here; `]` closes the innermost operator)."""
    stack = [[None, []]]
    for token in tokens:
        if token in listops.OPERATORS:
            stack.append([token, []])
        elif token == "]":
            op, args = stack.pop()
            args = sorted(args)
            result = {"[MIN": args[0], "[MAX": args[-1], "[SM": sum(args) % 10,
                      "[MED": (args[(len(args) - 1) // 2] + args[len(args) // 2]) // 2}[op]
            stack[-1][1].append(result)
        elif token.isdigit():
            stack[-1][1].append(int(token))
    (result,) = stack[0][1]
    return result


def test_unfiltered_trees_are_lras_draw_for_draw():
    """Same seed, same Random calls in the same order: the same trees, strings and values."""
    for seed in range(100):
        ours, n = listops.generate_tree(random.Random(seed), 1, 10, 10)
        theirs, m = lra_generate_tree(random.Random(seed), 1, 10, 10)
        assert n == m
        assert " ".join(listops.tokens(ours)) == lra_to_string(theirs)
        assert listops.value(ours) == lra_to_value(theirs) == stack_value(listops.tokens(ours))


def _shape(tree):
    """(depth, operator count, root operator or None, root's argument count)."""
    if isinstance(tree, int):
        return 1, 0, None, 0
    depths, ops = zip(*[_shape(a)[:2] for a in tree[1]])
    return 1 + max(depths), 1 + sum(ops), tree[0], len(tree[1])


def test_kept_trees_have_lras_distribution_of_lengths_depths_operators_and_values():
    """Abandoning a tree once it reaches max_length changes the random stream, not what is kept:
    1,500 kept trees each way (10 < length < 80, depth <= 6, 2..6 arguments), compared by two-sample
    tests."""
    ours = [listops.draw(random.Random(f"a{i}"), 10, 80, 6, 6) for i in range(1500)]
    theirs = [lra_draw(random.Random(f"b{i}"), 10, 80, 6, 6) for i in range(1500)]
    lengths = ([len([t for t in listops.tokens(x) if t != "(" and t != ")"]) for x in ours],
               [n for _, n in theirs])
    assert min(lengths[0]) > 10 and max(lengths[0]) < 80
    assert scipy_stats.ks_2samp(*lengths).pvalue > 1e-3
    values = ([listops.value(x) for x in ours], [int(lra_to_value(t)) for t, _ in theirs])
    shapes = ([_shape(x) for x in ours], [_shape(_from_lra(t)) for t, _ in theirs])
    for ours_, theirs_ in [values, [[s[0] for s in side] for side in shapes], [[s[2] for s in side] for side in shapes],
                           [[s[3] for s in side] for side in shapes]]:
        keys = sorted(set(ours_) | set(theirs_), key=str)
        table = [[collections.Counter(side)[k] for k in keys] for side in (ours_, theirs_)]
        table = np.array([row for row in np.array(table).T if sum(row) >= 10]).T   # chi-square needs counts
        assert scipy_stats.chi2_contingency(table).pvalue > 1e-3, (keys, table)


def _from_lra(t):
    """LRA's nested pairs -> (operator, arguments)."""
    if isinstance(t, int):
        return t
    body, args = t[0], []
    while not isinstance(body[0], str):
        body, arg = body
        args.append(arg)
    op, first = body
    return op, [_from_lra(a) for a in [first, *reversed(args)]]


def test_tasks_hold_lras_lengths_and_values_that_a_stack_evaluator_agrees_with():
    for name, (low, high) in {"listops": (500, 2000), "listops_1k": (100, 500)}.items():
        split = catalog.get_task(name).source.records("validation")
        assert len(split) == 2000 and len(catalog.get_task(name).source.records("train")) == 96000
        for i in range(5 if name == "listops" else 20):
            ex = split[i]
            tokens = ex["inputs"].split()
            assert low < len([t for t in tokens if t not in "()"]) < high
            assert ex["targets"] == str(stack_value(tokens))
            assert split[i] == ex   # a pure function of the index
    first = next(catalog.get_task("listops_1k").get_dataset("validation"))
    vocabulary = listops_tasks.VOCABULARY
    assert vocabulary.unk_id not in first["inputs"] and first["inputs"][-1] == vocabulary.eos_id
    assert vocabulary.decode(first["inputs"][:-1]) == first["inputs_pretokenized"]


def test_shipped_config_trains_a_few_steps_and_scores_the_values(tmp_path, clean_gin_state):
    run = str(tmp_path / "run")
    cli.main(["train", f"--gin_file={REPO / 'configs/local/listops_longformer.gin'}", f"--gin.MODEL_DIR='{run}'",
              "--gin.TRAIN_STEPS=2", "--gin.BATCH_SIZE=2", "--gin.TASK_FEATURE_LENGTHS={'inputs': 256, 'targets': 2}",
              "--gin.train.eval_every=2", "--gin.train.checkpoint_every=2", "--gin.train.log_every=1",
              "--gin.train.eval_max_examples=4", "--gin.train.eval_batch_size=4"])
    with open(os.path.join(run, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert np.isfinite([r["loss"] for r in records if "loss" in r]).all()
    assert [r for r in records if "eval_accuracy" in r]
