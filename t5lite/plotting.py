"""What t5lite's figures share: pyplot drawing to files, tick labels that read as plain decimals
(0.692, not 6.92×10⁻¹ or an offset like +6.9), whole-number ticks where the axis counts (steps, layers)."""
from __future__ import annotations

import numpy as np


def pyplot():
    """matplotlib.pyplot on the Agg backend: figures become files, never windows (and need no display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plain_number(value: float) -> str:
    """A tick value as a plain decimal with at most three significant digits: 0.692, 2000, 0.0001."""
    return np.format_float_positional(value, precision=3, unique=True, fractional=False, trim="-")


def plain_ticks(ax, integer_x: bool = False) -> None:
    """Plain decimal tick labels on the numeric axes of `ax`, linear or log (an axis of names, as
    a bar chart's, keeps them); with `integer_x`, x ticks only at whole numbers."""
    from matplotlib import ticker

    class PlainLogFormatter(ticker.LogFormatter):
        """LogFormatter's choice of which ticks to label (decades, or some minor ticks on a short
        range), each label a plain decimal."""
        def __call__(self, x, pos=None):
            return plain_number(x) if super().__call__(x, pos) else ""

    for axis in (ax.xaxis, ax.yaxis):
        current = axis.get_major_formatter()
        if isinstance(current, ticker.LogFormatter):
            axis.set_major_formatter(PlainLogFormatter())
            axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))
        elif isinstance(current, ticker.ScalarFormatter):
            formatter = ticker.ScalarFormatter(useOffset=False)
            formatter.set_scientific(False)
            axis.set_major_formatter(formatter)
    if integer_x:
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True, min_n_ticks=1))   # one layer: one tick, 0
