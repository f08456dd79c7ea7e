"""Evaluation of trained checkpoints, the way the paper reports them.

* :mod:`cofrgenet.eval.perplexity`: sliding-window perplexity (token, word, bits per byte).
* :mod:`cofrgenet.eval.detokenize`: the WikiText and PTB detokenisers.
* :mod:`cofrgenet.eval.tasks`: WikiText-2/103, PTB and LAMBADA from local files or the hub.
* :mod:`cofrgenet.eval.lambada`: last-word accuracy and target-word perplexity.
* :mod:`cofrgenet.eval.cli`: ``cofr eval``.
* :mod:`cofrgenet.eval.compare`: ``cofr compare``, runs beside the paper's rows.
* :mod:`cofrgenet.eval.glue`: ``cofr finetune glue``.
* :mod:`cofrgenet.eval.harness`: the lm-evaluation-harness model ``cofrgenet``.

A checkpoint is loaded by :func:`cofrgenet.training.pretrained.load_checkpoint` (model,
tokenizer, its MLflow run). Nothing here is imported by the layers below (ops, nn,
models, training).
"""
