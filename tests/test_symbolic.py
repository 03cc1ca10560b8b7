"""Generated inverse problems: Lample & Charton's expression distribution against their code
(transcribed below), prefix notation, SymPy equivalence, the bytecode task, and beam search with
verification."""
from __future__ import annotations

import time

import numpy as np
import pytest

sp = pytest.importorskip("sympy", reason="the symbolic extra (sympy) builds and checks expressions")
stats = pytest.importorskip("scipy.stats", reason="scipy's chi-square test checks the tree distribution")

from t5lite.data import bytecode, get_task, symbolic  # noqa: E402
from t5lite.data.tasks import symbolic as tasks  # noqa: E402


# --- transcribed from facebookresearch/SymbolicMathematics, src/envs/char_sp.py (CharSPEnvironment,
# with its settings self.nl = self.p1 = self.p2 = 1).

def reference_generate_ubi_dist(max_ops, nl=1, p1=1, p2=1):
    """`generate_ubi_dist`."""
    D = []
    D.append([0] + ([nl ** i for i in range(1, 2 * max_ops + 1)]))
    for n in range(1, 2 * max_ops + 1):
        s = [0]
        for e in range(1, 2 * max_ops - n + 1):
            s.append(nl * s[e - 1] + p1 * D[n - 1][e] + p2 * D[n - 1][e + 1])
        D.append(s)
    assert all(len(D[i]) >= len(D[i + 1]) for i in range(len(D) - 1))
    D = [[D[j][i] for j in range(len(D)) if i < len(D[j])] for i in range(max(len(x) for x in D))]
    return D


def reference_next_pos_probs(ubi_dist, nb_empty, nb_ops, nl=1, p1=1, p2=1):
    """The probabilities `sample_next_pos_ubi` draws from."""
    probs = []
    for i in range(nb_empty):
        probs.append((nl ** i) * p1 * ubi_dist[nb_empty - i][nb_ops - 1])
    for i in range(nb_empty):
        probs.append((nl ** i) * p2 * ubi_dist[nb_empty - i + 1][nb_ops - 1])
    return [p / ubi_dist[nb_empty][nb_ops] for p in probs]


def reference_write_int(val, base=10):
    """`write_int` with int_base 10, not balanced."""
    res = []
    max_digit = abs(base)
    neg = val < 0
    val = -val if neg else val
    while True:
        rem = val % base
        val = val // base
        if rem < 0 or rem > max_digit:
            rem -= base
            val += 1
        res.append(str(rem))
        if val == 0:
            break
    res.append('INT-' if neg else 'INT+')
    return res[::-1]


REFERENCE_OPERATORS = {sp.Add: 'add', sp.Mul: 'mul', sp.Pow: 'pow', sp.exp: 'exp', sp.log: 'ln', sp.sin: 'sin',
                       sp.cos: 'cos', sp.tan: 'tan'}


def reference_sympy_to_prefix(expr):
    """`sympy_to_prefix` / `_sympy_to_prefix` for the operators these tasks use."""
    if isinstance(expr, sp.Symbol):
        return [str(expr)]
    elif isinstance(expr, sp.Integer):
        return reference_write_int(int(str(expr)))
    elif isinstance(expr, sp.Rational):
        return ['div'] + reference_write_int(int(expr.p)) + reference_write_int(int(expr.q))
    elif expr == sp.E:
        return ['E']
    elif expr == sp.pi:
        return ['pi']
    for op_type, op in REFERENCE_OPERATORS.items():
        if isinstance(expr, op_type):
            n_args = len(expr.args)
            if op == 'pow' and isinstance(expr.args[1], sp.Rational) and expr.args[1].p == 1 and expr.args[1].q == 2:
                return ['sqrt'] + reference_sympy_to_prefix(expr.args[0])
            parse_list = []
            for i in range(n_args):
                if i == 0 or i < n_args - 1:
                    parse_list.append(op)
                parse_list += reference_sympy_to_prefix(expr.args[i])
            return parse_list
    raise ValueError(expr)


# --- the tree distribution


def test_tree_counts_are_lample_and_chartons_table():
    for max_ops in (1, 3, 6, 10):
        assert [list(row) for row in symbolic.tree_counts(max_ops)] == reference_generate_ubi_dist(max_ops)


def test_one_empty_node_counts_the_large_schroeder_numbers():
    """Unary-binary trees with n operators: the large Schröder numbers (OEIS A006318)."""
    assert [symbolic.tree_counts(7)[1][n] for n in range(8)] == [1, 2, 6, 22, 90, 394, 1806, 8558]


def test_next_operator_odds_are_sample_next_pos_ubi():
    max_ops = 6
    counts, reference = symbolic.tree_counts(max_ops), reference_generate_ubi_dist(max_ops)
    for ops in range(1, max_ops + 1):
        for empty in range(1, max_ops + 2 - ops):
            np.testing.assert_allclose(symbolic.next_operator_odds(counts, empty, ops),
                                       reference_next_pos_probs(reference, empty, ops), rtol=1e-12)


def all_shapes(num_ops: int, empty: int = 1) -> list[tuple[int, ...]]:
    """Every sequence of prefix arities filling `empty` nodes with `num_ops` operators (brute force)."""
    if empty == 0:
        return [()] if num_ops == 0 else []
    shapes = [(0,) + rest for rest in all_shapes(num_ops, empty - 1)]
    if num_ops:
        shapes += [(1,) + rest for rest in all_shapes(num_ops - 1, empty)]
        shapes += [(2,) + rest for rest in all_shapes(num_ops - 1, empty + 1)]
    return shapes


@pytest.mark.parametrize("num_ops", [2, 3, 4])
def test_sampled_tree_shapes_are_uniform(num_ops):
    shapes = all_shapes(num_ops)
    assert len(shapes) == [1, 2, 6, 22, 90][num_ops]
    rng = np.random.default_rng(num_ops)
    draws = 60 * len(shapes)
    index = {shape: i for i, shape in enumerate(shapes)}
    counts = np.zeros(len(shapes))
    for _ in range(draws):
        counts[index[tuple(symbolic.random_shape(num_ops, rng))]] += 1
    assert stats.chisquare(counts).pvalue > 1e-3


def test_random_expressions_follow_the_operator_and_leaf_weights():
    rng = np.random.default_rng(0)
    tokens = [t for _ in range(3000) for t in symbolic.random_expression(3, rng)]
    unary = {op: tokens.count(op) for op in symbolic.UNARY_WEIGHTS}
    binary = {op: tokens.count(op) for op in symbolic.BINARY_WEIGHTS}
    for observed, weights in ((unary, symbolic.UNARY_WEIGHTS), (binary, symbolic.BINARY_WEIGHTS)):
        expected = np.array(list(weights.values()), float)
        expected *= sum(observed.values()) / expected.sum()
        assert stats.chisquare(list(observed.values()), expected).pvalue > 1e-3
    leaves = tokens.count("x") + tokens.count("INT+")
    assert tokens.count("x") / leaves == pytest.approx(symbolic.LEAF_VARIABLE_PROBABILITY, abs=0.02)


# --- prefix notation


@pytest.mark.parametrize("value", [0, 1, 7, -12, 305, -40960])
def test_integers_are_written_as_write_int(value):
    assert symbolic.integer_tokens(value) == reference_write_int(value)
    assert symbolic.to_sympy(reference_write_int(value)) == value


def test_prefix_round_trips_and_matches_sympy_to_prefix():
    rng = np.random.default_rng(1)
    seen = 0
    for _ in range(200):
        expr = symbolic.random_function(rng, 4)
        if expr is None:
            continue
        for e in (expr, sp.diff(expr, symbolic.symbol())):
            try:
                reference = reference_sympy_to_prefix(e)
            except ValueError:
                continue   # abs, sign, ...: neither notation writes them
            assert symbolic.from_sympy(e) == reference
            assert symbolic.to_sympy(reference) == e
            seen += 1
    assert seen > 150


@pytest.mark.parametrize("text", ["", "add x", "add x x x", "foo", "INT+", "INT+ x", "pow x"])
def test_malformed_prefix_is_refused(text):
    with pytest.raises(symbolic.InvalidExpression):
        symbolic.to_sympy(text)


# --- equivalence


@pytest.mark.parametrize("prediction, target", [
    ("mul INT+ 2 x", "add x x"),
    ("add pow sin x INT+ 2 pow cos x INT+ 2", "INT+ 1"),
    ("mul x x", "pow2 x"),
    ("div x INT+ 2", "mul div INT+ 1 INT+ 2 x"),
    ("exp add x ln INT+ 3", "mul INT+ 3 exp x"),
])
def test_equivalent_forms_are_accepted(prediction, target):
    assert symbolic.same_function(prediction, target)


@pytest.mark.parametrize("prediction, target", [
    ("x", "add x INT+ 1"),
    ("sin x", "x"),
    ("mul INT+ 2 x", "mul INT+ 3 x"),
    ("add x", "x"), ("", "x"), ("garbage tokens", "x"), ("x", "not a target"),
])
def test_wrong_or_malformed_answers_are_rejected(prediction, target):
    assert not symbolic.same_function(prediction, target)


def test_a_primitive_is_right_up_to_a_constant():
    assert symbolic.is_antiderivative("add pow2 x INT+ 7", "mul INT+ 2 x")
    assert symbolic.same_primitive("add pow2 x INT+ 7", "pow2 x")
    assert not symbolic.same_primitive("pow x INT+ 3", "pow2 x")
    assert symbolic.is_derivative_of("mul INT+ 2 x", "add pow2 x INT+ 7")
    assert not symbolic.is_derivative_of("x", "add pow2 x INT+ 7")


def test_a_hostile_prediction_is_refused_fast():
    start = time.perf_counter()
    assert not symbolic.same_function("pow pow pow INT+ 9 9 INT+ 9 9 INT+ 9 9 INT+ 9 9", "x")
    assert not symbolic.same_function("pow INT+ 9 9 9 9 9 9 INT+ 9 9 9 9 9 9 9", "x")
    assert time.perf_counter() - start < 5


def test_numbers_decide_when_simplify_runs_out_of_time(monkeypatch):
    """SymPy cannot finish: a right answer still passes by the numeric check, a wrong one fails."""
    def slow(expr, *args, **kwargs):
        time.sleep(10)
    monkeypatch.setattr(sp, "simplify", slow)
    monkeypatch.setattr(symbolic, "TIME_LIMIT_SECONDS", 0.3)
    start = time.perf_counter()
    assert symbolic.equivalent(sp.sin(symbolic.symbol()) ** 2, 1 - sp.cos(symbolic.symbol()) ** 2, seconds=0.3)
    assert not symbolic.equivalent(symbolic.symbol(), symbolic.symbol() + 1, seconds=0.3)
    assert time.perf_counter() - start < 3


# --- bytecode


def test_bytecode_examples_compile_back_to_their_listing():
    rng = np.random.default_rng(0)
    examples = [e for e in (bytecode.example(rng, 4) for _ in range(100)) if e is not None]
    assert len(examples) > 50
    for listing, source in examples:
        assert bytecode.listing(source) == listing
        assert bytecode.compiles_to(source, listing)
        assert all(token in tasks.VOCABULARY.words for token in (listing + " " + source).split())


def test_bytecode_accepts_any_source_with_the_same_listing():
    listing = bytecode.listing("(a + 1) * b")
    assert bytecode.compiles_to("( ( a + 1 ) ) * b", listing)
    assert not bytecode.compiles_to("a + 1 * b", listing)
    assert not bytecode.compiles_to("( a + 1", listing)
    assert not bytecode.compiles_to("import os", listing)


# --- tasks


def test_splits_are_pure_functions_of_the_index_and_disjoint():
    first = tasks.GeneratedSplit(symbolic.derivative_example, "validation")
    again = tasks.GeneratedSplit(symbolic.derivative_example, "validation")
    train = tasks.GeneratedSplit(symbolic.derivative_example, "train")
    assert [first[i] for i in range(5)] == [again[i] for i in range(5)]
    assert all(tasks.in_validation(first[i]["inputs"]) for i in range(5))
    assert not any(tasks.in_validation(train[i]["inputs"]) for i in range(20))


@pytest.mark.parametrize("name", sorted(tasks.GENERATORS))
def test_tasks_yield_tokenized_pairs_their_metrics_and_verifiers_accept(name):
    task = get_task(name)
    examples = [ex for _, ex in zip(range(4), task.get_dataset("validation", {"inputs": 48, "targets": 48}))]
    targets = [ex["targets_pretokenized"] for ex in examples]
    for ex in examples:
        assert ex["targets"][-1] == tasks.VOCABULARY.eos_id
        assert tasks.VOCABULARY.unk_id not in ex["inputs"] and tasks.VOCABULARY.unk_id not in ex["targets"]
        assert tasks.VERIFIERS[name](ex["targets_pretokenized"], ex["inputs_pretokenized"])
    metrics = {k: v for fn in task.metric_fns for k, v in fn(targets, targets).items()}
    assert metrics == {"accuracy": 100.0, "equivalence": 100.0}
    wrong = {k: v for fn in task.metric_fns for k, v in fn(targets, ["x"] * len(targets)).items()}
    assert wrong["equivalence"] < 100.0
