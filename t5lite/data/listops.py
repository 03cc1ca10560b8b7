"""ListOps (Nangia & Bowman 2018) as Long Range Arena generates it (Tay et al. 2021,
google-research/long-range-arena `lra_benchmarks/data/listops.py`): nested lists of digits under
the operators MIN, MAX, MED (the median, rounded down) and SM (the sum modulo 10), whose value,
a digit, is the answer. A task that needs the whole sequence: one digit deep in the tree can change
the root's value.

`generate_tree` draws LRA's distribution: below `max_depth` a node is a digit with probability
0.75, else an operator (uniform over the four) on 2..`max_args` arguments drawn the same way one
level down; at `max_depth` it is a digit. A tree's `length` counts its digits, operators and
closing `]`s; LRA keeps trees with `min_length < length < max_length` (500 and 2000) and writes
them with its parentheses (`tokens`), so a kept tree is some 1.5 to 2 times as many tokens.
"""
from __future__ import annotations

import random
from typing import Union

import numpy as np

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VALUE_P = 0.25        # LRA's chance of an operator below max_depth
MAX_DEPTH, MAX_ARGS, MIN_LENGTH, MAX_LENGTH = 10, 10, 500, 2000   # LRA's flags' defaults
TOKENS = ("(", ")", END, *OPERATORS, *map(str, range(10)))

Tree = Union[int, tuple[str, list["Tree"]]]


def generate_tree(rng: random.Random, depth: int = 1, max_depth: int = MAX_DEPTH, max_args: int = MAX_ARGS,
                  limit: float = np.inf) -> tuple[Tree | None, int]:
    """(a tree: a digit or (operator, arguments), its length), drawn as LRA's `generate_tree` draws.
    A tree that reaches `limit` is abandoned there (None): the filter would drop it, and the trees it
    keeps are drawn as before, at a fraction of the cost (an operator has 1.5 operator arguments
    on average, so unbounded trees grow until max_depth)."""
    if (rng.random() if depth < max_depth else 1.0) > VALUE_P:
        return rng.randrange(10), 1
    arguments, length = [], 2
    for _ in range(rng.randint(2, max_args)):
        tree, n = generate_tree(rng, depth + 1, max_depth, max_args, limit - length)
        length += n
        if tree is None or length >= limit:
            return None, length
        arguments.append(tree)
    return (rng.choice(OPERATORS), arguments), length


def draw(rng: random.Random, min_length: int = MIN_LENGTH, max_length: int = MAX_LENGTH,
         max_depth: int = MAX_DEPTH, max_args: int = MAX_ARGS) -> Tree:
    """Trees drawn until one has min_length < length < max_length (LRA's filter)."""
    while True:
        tree, length = generate_tree(rng, 1, max_depth, max_args, max_length)
        if tree is not None and min_length < length < max_length:
            return tree


def tokens(tree: Tree) -> list[str]:
    """LRA's `to_string` split on spaces: an operator on arguments a1..ak is its k + 1 nested pairs
    of parentheses, `( ( ( [MAX a1 ) a2 ) ... ak ) ] )`."""
    if isinstance(tree, int):
        return [str(tree)]
    op, arguments = tree
    out = ["("] * (len(arguments) + 1) + [op]
    for argument in arguments:
        out += tokens(argument) + [")"]
    return out + [END, ")"]


def value(tree: Tree) -> int:
    """The tree's digit."""
    if isinstance(tree, int):
        return tree
    op, arguments = tree
    values = [value(a) for a in arguments]
    if op == "[MIN":
        return min(values)
    if op == "[MAX":
        return max(values)
    if op == "[MED":
        return int(np.median(values))
    return sum(values) % 10
