"""Failure handling in one place: surviving env-runner failures, checkpointing R3L's own state and
reproducible sampling (``resilience``), and the fault injection that tests it (``faults``)."""
