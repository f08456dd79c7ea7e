"""Benchmarks behind ``cofr bench``: fixed workloads, medians over interleaved repeats.

* :mod:`cofrgenet.bench.ops`: literal vs continuant continued-fraction ops.
* :mod:`cofrgenet.bench.timing`: synchronised wall-clock timing helpers.

See docs/benchmarks/README.md.
"""
