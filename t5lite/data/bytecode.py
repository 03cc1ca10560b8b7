"""Python bytecode back to its source, an inverse problem with a free verifier: a random arithmetic
expression (a uniform tree shape from t5lite.data.symbolic, names a, b, c and digits 1..9) is
compiled with `compile()`, and its `dis` listing is the question, the source the answer. Any source
that compiles to the same listing is right (`compiles_to`); compiling never runs the text.
"""
from __future__ import annotations

import ast
import dis
import io
import tokenize

import numpy as np

from t5lite.data.symbolic import random_shape

NAMES = ("a", "b", "c")
MAX_INT = 9
UNARY = {"-": ast.USub}
BINARY = {"+": ast.Add, "-": ast.Sub, "*": ast.Mult, "/": ast.Div, "//": ast.FloorDiv, "%": ast.Mod}
SKIPPED = ("RESUME", "CACHE", "RETURN_VALUE")   # in every listing alike
OPNAMES = ("LOAD_NAME", "LOAD_CONST", "BINARY_OP", "UNARY_NEGATIVE")
TOKENS = (*OPNAMES, *NAMES, *(str(d) for d in range(1, MAX_INT + 1)), *BINARY, "(", ")")
NAME_PROBABILITY = 0.6


def random_source(num_ops: int, rng: np.random.Generator) -> str:
    """Source of a random expression with `num_ops` operators, as `ast.unparse` writes it (only the
    parentheses it needs)."""
    arities = iter(random_shape(num_ops, rng))

    def node() -> ast.expr:
        arity = next(arities)
        if arity == 1:
            return ast.UnaryOp(UNARY["-"](), node())
        if arity == 2:
            op = BINARY[list(BINARY)[int(rng.integers(len(BINARY)))]]()
            left = node()
            return ast.BinOp(left, op, node())
        if rng.random() < NAME_PROBABILITY:
            return ast.Name(NAMES[int(rng.integers(len(NAMES)))], ast.Load())
        return ast.Constant(int(rng.integers(1, MAX_INT + 1)))

    return ast.unparse(ast.fix_missing_locations(ast.Expression(node())))


def spaced(source: str) -> str:
    """Python's tokens of `source`, one space apart (a word vocabulary's text)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return " ".join(t.string for t in tokens if t.string.strip())


def listing(source: str) -> str:
    """The `dis` listing of `source` compiled as an expression: opname and argument per instruction."""
    code = compile(source, "<expression>", "eval")
    return " ".join(f"{i.opname} {i.argrepr}".strip() for i in dis.get_instructions(code) if i.opname not in SKIPPED)


def _folded(source: str) -> bool:
    """Whether the compiler folded constants (2 * 3 -> 6): the listing then cannot give the source back."""
    code = compile(source, "<expression>", "eval")
    return any(i.opname == "LOAD_CONST" and i.argval not in range(1, MAX_INT + 1) for i in dis.get_instructions(code))


def example(rng: np.random.Generator, max_ops: int) -> tuple[str, str] | None:
    """(listing, spaced source) of a random expression with 1..max_ops operators; None when the
    compiler folded constants (the caller draws again)."""
    source = random_source(int(rng.integers(1, max_ops + 1)), rng)
    return None if _folded(source) else (listing(source), spaced(source))


def compiles_to(prediction: str, question: str) -> bool:
    """A predicted source is right: it compiles to the question's listing."""
    try:
        return listing(str(prediction)) == question
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError, OverflowError):
        return False


def same_bytecode(prediction: str, target: str) -> bool:
    """A predicted source compiles to what the target source compiles to."""
    return compiles_to(prediction, listing(target))
