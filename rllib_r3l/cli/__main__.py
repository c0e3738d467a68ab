"""``python -m rllib_r3l.cli`` and the ``rllib-r3l`` command: ``commands.main``, then the process ends
without the interpreter's teardown (``signals.exit_process``)."""

from rllib_r3l.cli.commands import main
from rllib_r3l.cli.signals import exit_process


def run() -> None:
    exit_process(main())


if __name__ == "__main__":
    run()
