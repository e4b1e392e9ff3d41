"""``python -m kernel`` is the ``dirk`` command."""

import sys

from kernel.cli import main

sys.exit(main())
