"""``python -m rllib_r3l.cli``: the same as the ``rllib-r3l`` command."""

import sys

from rllib_r3l.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
