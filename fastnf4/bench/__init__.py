"""Benchmarks: a registry of named benchmarks (``registry.py``), a timing harness (``harness.py``) and one
module per benchmark. Rows are tidy dicts (op, provider, shape, dtype, median/p20/p80, bytes, GB/s, % of
copy bandwidth), written as JSON with the environment (GPU, versions, commit) beside them."""
