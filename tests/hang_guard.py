"""The one wall-clock bound the tests may use: a hang guard, not a speed assertion.

A test that waits on a child process (a subprocess, a forked builder, a training run) waits for
what it needs (the child's exit, a file it writes), and fails at once when the child exits without
producing it. ``HANG_GUARD_S`` bounds such a wait only so that a *hung* child (a deadlock, a lost
wake-up) ends the test instead of the CI job: it is far above anything a correct child takes, even
on a heavily loaded 2-core machine (the slowest waits here take minutes there), so that a slow
machine is never reported as a failure. Never use a tighter bound to check speed.
"""

HANG_GUARD_S = 3600.0
