"""Checkpoints written in other ecosystems' formats: ``cofr export hf`` (Hugging Face).

:mod:`cofrgenet.export.hf` writes a ``transformers`` model folder (remote code in
:mod:`cofrgenet.export.hf_modeling`, which imports only torch and transformers).
"""
