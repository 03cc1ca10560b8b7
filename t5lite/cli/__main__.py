"""`python -m t5lite.cli`, as the `t5lite` script (the sweep runner and the tests run commands so)."""
from t5lite.cli import main

main()
