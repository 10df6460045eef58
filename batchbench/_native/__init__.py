"""Compiled hot paths (built from ``csrc/``); each has a pure-Python twin in ``batchbench``."""
