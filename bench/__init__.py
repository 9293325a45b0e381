"""The benchmarks (bench/README.md). A package so that its modules import each other as `bench.<name>`
and nothing here is ever first on sys.path, where a file could stand in for a standard-library module
(bench/profile.py once hid `profile`, and pyspark's `import cProfile` broke). Run each from the
repository root as `python -m bench.<name>`."""
