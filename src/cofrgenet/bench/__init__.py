"""Benchmarks behind ``cofr bench``: fixed workloads, medians over interleaved repeats.

* :mod:`cofrgenet.bench.ops`: literal vs continuant continued-fraction ops.
* :mod:`cofrgenet.bench.train`: training and generation speed of the model variants.
* :mod:`cofrgenet.bench.timing`: synchronised wall-clock timing helpers.
* :mod:`cofrgenet.bench.files`: report files written atomically (partial reports).

See docs/benchmarks/README.md.
"""
