"""``python -m proxy`` is the same as the ``tailfloor`` command."""

import sys

from proxy.cli import main

sys.exit(main())
