"""``python -m proxy`` is the same as the ``tailfloor`` command."""

import sys

from proxy.cli.main import main

sys.exit(main())
