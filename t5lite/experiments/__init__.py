"""Sweeps: grids of runs at equal compute and their reports with confidence intervals."""
