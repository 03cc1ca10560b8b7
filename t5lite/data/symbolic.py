"""Random expressions as Lample & Charton generate them ("Deep Learning for Symbolic Mathematics",
2019), their prefix notation, and checking an answer with SymPy.

Trees: a unary-binary tree with n operators is drawn uniformly among all such trees (their code:
facebookresearch/SymbolicMathematics, src/envs/char_sp.py, `generate_ubi_dist`,
`sample_next_pos_ubi`, `_generate_expr`): `tree_counts` counts D(e, n), the ways n operators can
fill e empty nodes, and each operator's place and arity are drawn in proportion to the trees that
remain possible. Operators (by weight) and leaves (x, or an integer 1..5) are filled in afterwards.
How many operators, as their `gen_prim_bwd`: one draw in 40 has 0..3, the others 4..max_ops, and a
draw that SymPy's evaluation shrinks below half its operators is drawn again (`operator_count`,
`random_function`), so small expressions, which would repeat, stay rare.

Prefix notation (their `sympy_to_prefix` / `write_int`): operators before their arguments, `add`
and `mul` chained to the right, an integer as its sign then its decimal digits (`INT- 1 2` is -12),
a rational as `div p q`, x ** (1/2) as `sqrt`.

An answer is right when it equals the reference as a function: `equivalent` rejects at once where
the two differ at one of ten fixed points (sound: equal functions agree wherever both are defined), accepts
when SymPy simplifies their difference to 0, and otherwise accepts a numeric agreement at enough
points, SymPy's work bounded by a time limit. Malformed text is never an error, only a wrong answer.

SymPy is imported lazily: `pip install 't5lite[symbolic]'`.
"""
from __future__ import annotations

import contextlib
import functools
import math
import signal
import threading
from typing import Any, Sequence

import numpy as np

from t5lite.errors import ConfigError

# Lample & Charton's operator weights, restricted to what a tiny model learns in minutes.
UNARY_WEIGHTS = {"exp": 4, "ln": 4, "sin": 4, "cos": 4, "sqrt": 4, "pow2": 4}
BINARY_WEIGHTS = {"add": 10, "sub": 3, "mul": 10, "div": 5}
# Every operator a prefix expression may hold (SymPy's answers also use `pow` and `tan`).
ARITY = {**{op: 1 for op in (*UNARY_WEIGHTS, "tan")}, **{op: 2 for op in (*BINARY_WEIGHTS, "pow")}}
CONSTANTS = ("E", "pi")
VARIABLE = "x"
INTEGER_SIGNS = ("INT+", "INT-")
DIGITS = tuple(str(d) for d in range(10))
TOKENS = (*ARITY, VARIABLE, *CONSTANTS, *INTEGER_SIGNS, *DIGITS)
LEAF_VARIABLE_PROBABILITY = 0.75   # their leaf_probs "0.75,0,0.25,0": x, else an integer
MAX_INT = 5

MAX_LOG10 = 300          # a constant SymPy would compute exactly may have at most this many digits
TIME_LIMIT_SECONDS = 2.0   # of CPU time, per SymPy step of a check
REPEAT_SECONDS = 0.05
POINTS = np.array([-3.1, -2.1, -1.1, -0.7, -0.3, 0.3, 0.7, 1.1, 2.1, 3.1])  # after their EVAL_VALUES
MIN_AGREEING_POINTS = 4
RELATIVE_TOLERANCE = 1e-6


class InvalidExpression(ValueError):
    """Text that is not a prefix expression, or an expression the task cannot use."""


def sympy():
    """SymPy, or one line naming the extra that installs it."""
    try:
        import sympy as sp
    except ModuleNotFoundError:
        raise ConfigError("the symbolic tasks need SymPy: pip install 't5lite[symbolic]'") from None
    return sp


def symbol():
    """x, real and nonzero as in Lample & Charton's environment."""
    return sympy().Symbol(VARIABLE, real=True, nonzero=True)


# --- uniform random trees


@functools.lru_cache(maxsize=None)
def tree_counts(max_ops: int) -> tuple[tuple[int, ...], ...]:
    """D[e][n] for e + n <= 2 * max_ops: the unary-binary trees n operators make from e empty nodes.
    D(0, n) = 0, D(e, 0) = 1, D(e, n) = D(e - 1, n) + D(e, n - 1) + D(e + 1, n - 1): the first empty
    node becomes a leaf, a unary or a binary operator."""
    size = 2 * max_ops
    counts = [[0] * (size - e + 1) for e in range(size + 1)]
    for e in range(1, size + 1):
        counts[e][0] = 1
    for n in range(1, size + 1):
        for e in range(1, size - n + 1):
            counts[e][n] = counts[e - 1][n] + counts[e][n - 1] + counts[e + 1][n - 1]
    return tuple(tuple(row) for row in counts)


def next_operator_odds(counts, empty: int, ops: int) -> np.ndarray:
    """[2 * empty] chances that the next operator skips k empty nodes (they become leaves) and is
    unary (first half) or binary (second half), each in proportion to the trees it leaves possible."""
    unary = [counts[empty - k][ops - 1] for k in range(empty)]
    binary = [counts[empty - k + 1][ops - 1] for k in range(empty)]
    return np.array(unary + binary, dtype=np.float64) / counts[empty][ops]


def random_shape(num_ops: int, rng: np.random.Generator) -> list[int]:
    """The arities of a uniformly drawn unary-binary tree with `num_ops` operators, in prefix order
    (0 for a leaf)."""
    counts = tree_counts(max(num_ops, 1))
    nodes: list[int | None] = [None]   # None: an empty node still to fill
    empty, leaves_before = 1, 0
    for ops in range(num_ops, 0, -1):
        choice = int(rng.choice(2 * empty, p=next_operator_odds(counts, empty, ops)))
        skipped, arity = choice % empty, 1 + choice // empty
        empty += arity - 1 - skipped
        leaves_before += skipped
        position = [i for i, node in enumerate(nodes) if node is None][leaves_before]
        nodes[position:position + 1] = [arity] + [None] * arity
    return [0 if node is None else node for node in nodes]


def _weighted(rng: np.random.Generator, weights: dict[str, float]) -> str:
    names = list(weights)
    p = np.array([weights[n] for n in names], dtype=np.float64)
    return names[int(rng.choice(len(names), p=p / p.sum()))]


def random_expression(num_ops: int, rng: np.random.Generator) -> list[str]:
    """A random expression in prefix tokens: a uniform tree shape, operators by weight, leaves x or
    a positive integer up to MAX_INT."""
    tokens = []
    for arity in random_shape(num_ops, rng):
        if arity:
            tokens.append(_weighted(rng, UNARY_WEIGHTS if arity == 1 else BINARY_WEIGHTS))
        elif rng.random() < LEAF_VARIABLE_PROBABILITY:
            tokens.append(VARIABLE)
        else:
            tokens += integer_tokens(int(rng.integers(1, MAX_INT + 1)))
    return tokens


# --- prefix notation <-> SymPy


def integer_tokens(value: int) -> list[str]:
    return [INTEGER_SIGNS[value < 0], *str(abs(value))]


def to_sympy(tokens: Sequence[str] | str):
    """The SymPy expression of prefix tokens (a list, or text split on spaces); InvalidExpression
    for anything else, and for constants too large to compute exactly."""
    tokens = tokens.split() if isinstance(tokens, str) else list(tokens)
    expr, rest = _parse(tokens, 0)
    if rest != len(tokens):
        raise InvalidExpression(f"{len(tokens) - rest} tokens left over after a complete expression")
    return expr


def _parse(tokens: Sequence[str], i: int):
    """The expression starting at tokens[i] and the index after it."""
    sp = sympy()
    if i >= len(tokens):
        raise InvalidExpression("the expression ends too early")
    token = tokens[i]
    if token in INTEGER_SIGNS:
        end = i + 1
        while end < len(tokens) and tokens[end] in DIGITS:
            end += 1
        if end == i + 1 or end - i - 1 > MAX_LOG10:
            raise InvalidExpression(f"{token} needs between 1 and {MAX_LOG10} digits")
        value = int("".join(tokens[i + 1:end]))
        return sp.Integer(-value if token == "INT-" else value), end
    if token == VARIABLE:
        return symbol(), i + 1
    if token in CONSTANTS:
        return {"E": sp.E, "pi": sp.pi}[token], i + 1
    if token not in ARITY:
        raise InvalidExpression(f"unknown token {token!r}")
    args, i = [], i + 1
    for _ in range(ARITY[token]):
        arg, i = _parse(tokens, i)
        args.append(arg)
    return _apply(token, args), i


def _apply(op: str, args: list):
    sp = sympy()
    if op in ("pow", "pow2", "div"):
        exponent = {"pow": args[-1], "pow2": sp.Integer(2), "div": sp.Integer(-1)}[op]
        power = _power(args[0] if op != "div" else args[1], exponent)
        return args[0] * power if op == "div" else power
    binary = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}
    if op in binary:
        return binary[op](*args)
    return {"exp": sp.exp, "ln": sp.log, "sin": sp.sin, "cos": sp.cos, "tan": sp.tan, "sqrt": sp.sqrt}[op](args[0])


def _power(base, exponent):
    """base ** exponent, refused when both are numbers and the result has more than MAX_LOG10 digits
    (SymPy computes it exactly, and a prediction could ask for 9 ** 9 ** 9)."""
    sp = sympy()
    if base.is_Number and exponent.is_Number and base != 0:
        if abs(float(exponent)) * abs(math.log10(abs(float(base)))) > MAX_LOG10:
            raise InvalidExpression("a constant too large to compute")
    return sp.Pow(base, exponent)


SYMPY_OPERATORS = {"Add": "add", "Mul": "mul", "Pow": "pow", "exp": "exp", "log": "ln", "sin": "sin",
                   "cos": "cos", "tan": "tan"}


def from_sympy(expr) -> list[str]:
    """Prefix tokens of a SymPy expression; InvalidExpression for what the notation cannot write."""
    sp = sympy()
    if expr.is_Symbol and expr.name == VARIABLE:
        return [VARIABLE]
    if expr.is_Integer:
        return integer_tokens(int(expr))
    if expr.is_Rational:
        return ["div", *integer_tokens(int(expr.p)), *integer_tokens(int(expr.q))]
    if expr == sp.E or expr == sp.pi:
        return [str(expr)]
    name = SYMPY_OPERATORS.get(type(expr).__name__)
    if name is None or not expr.args:
        raise InvalidExpression(f"the prefix notation has no token for {expr}")
    if name == "pow" and expr.args[1] == sp.Rational(1, 2):
        return ["sqrt", *from_sympy(expr.args[0])]
    tokens = []
    for k, arg in enumerate(expr.args):   # add a add b c: n-ary sums and products chain to the right
        if k == 0 or k < len(expr.args) - 1:
            tokens.append(name)
        tokens += from_sympy(arg)
    return tokens


# --- checking answers


class TimeLimitExceeded(Exception):
    pass


SYMPY_FAILURES = (InvalidExpression, TimeLimitExceeded, ArithmeticError, TypeError, ValueError, RecursionError)


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raises TimeLimitExceeded in the block after `seconds` of this process' CPU time (so a busy
    machine does not fail answers), by SIGVTALRM, so only in the main thread; elsewhere the block
    runs unbounded. The signal repeats until the block ends, in case code that swallows exceptions
    (a garbage-collection callback) received it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeLimitExceeded()

    previous = signal.signal(signal.SIGVTALRM, expire)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds, REPEAT_SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


def values_at_points(expr) -> np.ndarray:
    """The expression's real values at POINTS (nan where it is undefined or not real)."""
    sp = sympy()
    out = np.full(len(POINTS), np.nan)
    for k, point in enumerate(POINTS):
        try:
            value = complex(expr.subs(symbol(), sp.Float(point)).evalf())
        except (ArithmeticError, TypeError, ValueError):   # too large, or not a number there
            continue
        if math.isfinite(value.real) and abs(value.imag) <= RELATIVE_TOLERANCE * max(1.0, abs(value.real)):
            out[k] = value.real
    return out


def _numeric_agreement(a, b) -> tuple[bool, int]:
    """Whether a and b agree wherever both are defined, and at how many points that is."""
    va, vb = values_at_points(a), values_at_points(b)
    both = np.isfinite(va) & np.isfinite(vb)
    scale = np.maximum(1.0, np.maximum(np.abs(va[both]), np.abs(vb[both])))
    return bool(np.all(np.abs(va[both] - vb[both]) <= RELATIVE_TOLERANCE * scale)), int(both.sum())


def equivalent(a, b, seconds: float = TIME_LIMIT_SECONDS) -> bool:
    """Whether SymPy expressions a and b are the same function of x (see the module docstring)."""
    try:
        with time_limit(seconds):
            agree, defined = _numeric_agreement(a, b)
    except SYMPY_FAILURES:
        return False
    if not agree:
        return False
    try:
        with time_limit(seconds):
            if sympy().simplify(a - b) == 0:
                return True
    except SYMPY_FAILURES:
        pass   # out of time or beyond SymPy: the numbers decide
    return defined >= MIN_AGREEING_POINTS


def _parsed(text: Any):
    """The SymPy expression of a prediction's text, or None when it is not one."""
    try:
        with time_limit(TIME_LIMIT_SECONDS):
            return to_sympy(str(text))
    except SYMPY_FAILURES:
        return None


def _derivative(expr):
    """d expr / dx, or None when SymPy fails or runs out of time."""
    try:
        with time_limit(TIME_LIMIT_SECONDS):
            return sympy().diff(expr, symbol())
    except SYMPY_FAILURES:
        return None


def _equal(a, b) -> bool:
    return a is not None and b is not None and equivalent(a, b)


def same_function(prediction: str, target: str) -> bool:
    """A predicted prefix expression is right: it equals the target as a function."""
    return _equal(_parsed(prediction), _parsed(target))


def is_derivative_of(prediction: str, question: str) -> bool:
    """Verification of a derivative: it equals SymPy's derivative of the question."""
    question = _parsed(question)
    return question is not None and _equal(_parsed(prediction), _derivative(question))


def is_antiderivative(prediction: str, integrand: str) -> bool:
    """Verification of a primitive: its derivative equals the integrand (any constant goes)."""
    predicted = _parsed(prediction)
    return predicted is not None and _equal(_derivative(predicted), _parsed(integrand))


def same_primitive(prediction: str, target: str) -> bool:
    """A predicted primitive equals the target up to a constant: their derivatives are equal."""
    predicted, expected = _parsed(prediction), _parsed(target)
    if predicted is None or expected is None:
        return False
    return _equal(_derivative(predicted), _derivative(expected))


# --- task examples

FEW_OPS_EVERY = 40   # gen_prim_bwd: `if rng.randint(40) == 0: nb_ops = rng.randint(0, 4)`
FEW_OPS = 4

MAX_TOKENS = 40   # prefix tokens of an input or a target; longer pairs are drawn again


def operator_count(rng: np.random.Generator, max_ops: int) -> int:
    """Operators of the next draw, as `gen_prim_bwd`: 0..3 one time in 40, else 4..max_ops."""
    if rng.integers(FEW_OPS_EVERY) == 0:
        return int(rng.integers(0, FEW_OPS))
    return int(rng.integers(FEW_OPS, max_ops + 1))


def random_function(rng: np.random.Generator, max_ops: int):
    """A random expression that depends on x and is real, with `operator_count` operators of which
    SymPy's evaluation keeps at least half (None otherwise: the caller draws again)."""
    num_ops = operator_count(rng, max_ops)
    expr = to_sympy(random_expression(num_ops, rng))
    if symbol() not in expr.free_symbols or not _is_real(expr):
        return None
    try:
        kept = sum(token in ARITY for token in from_sympy(expr))
    except InvalidExpression:
        return None
    return expr if kept >= num_ops / 2 else None


def _is_real(expr) -> bool:
    sp = sympy()
    return not expr.has(sp.I, sp.zoo, sp.oo, -sp.oo, sp.nan)


def prefix_pair(question, answer) -> tuple[str, str] | None:
    """(question, answer) as prefix text, None when either cannot be written or is too long."""
    if not (_is_real(question) and _is_real(answer)):
        return None
    try:
        pair = from_sympy(question), from_sympy(answer)
    except InvalidExpression:
        return None
    return None if max(map(len, pair)) > MAX_TOKENS else (" ".join(pair[0]), " ".join(pair[1]))


def derivative_example(rng: np.random.Generator, max_ops: int) -> tuple[str, str] | None:
    """f -> f' (their forward direction, here for derivatives)."""
    f = random_function(rng, max_ops)
    return None if f is None else prefix_pair(f, sympy().diff(f, symbol()))


def integration_example(rng: np.random.Generator, max_ops: int) -> tuple[str, str] | None:
    """Their backward generation: a random F without an additive constant; the question is F'
    simplified (SymPy's `cancel`: one fraction, common factors cancelled; `simplify` costs 20 times
    as much per example, too slow to generate batches on the fly), the answer F."""
    sp = sympy()
    F = random_function(rng, max_ops)
    if F is None:
        return None
    F = F.as_independent(symbol(), as_Add=True)[1]
    return prefix_pair(sp.cancel(sp.diff(F, symbol())), F)
