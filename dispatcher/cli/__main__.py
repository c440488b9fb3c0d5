"""``python -m dispatcher.cli``: the ``dispatcher`` command without the console script."""

import sys

from dispatcher.cli import main

sys.exit(main())
