"""On-demand benchmarks (never timed unit tests): each script answers one question of
docs/benchmarks.md and writes its raw results under ``benchmarks/results/``; ``harness`` holds what
they share. Their arithmetic is tested in ``benchmarks/tests/``."""
