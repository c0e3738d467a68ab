"""The benchmarks' tests: their arithmetic on hand values, with the test suite's shared fixtures
(``tiny_model_dir``, ``tiny_tokenizer``: the tiny random model of ``tests/conftest.py``)."""

from tests.conftest import tiny_model_dir, tiny_tokenizer  # noqa: F401  (shared fixtures)
