"""Benchmark scripts. Run each from the repository root as a module, e.g.
``.venv/bin/python -m benchmarks.compressors --sweep-only``; they import each other as
``benchmarks.<name>`` and the library as ``horovod_gravac``."""
