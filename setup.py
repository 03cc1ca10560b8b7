"""For tools that predate pyproject.toml, where all the metadata lives."""
from setuptools import setup
setup()
