"""Benchmarks: each prints ratios against a baseline measured in the same run (`python -m bench.<name>`
from the repository root; bench/README.md)."""
