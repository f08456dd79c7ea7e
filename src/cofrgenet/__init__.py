"""cofrgenet: continued-fraction language models."""
