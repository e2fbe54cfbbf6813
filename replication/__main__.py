"""``python -m replication``: the command line (see ``replication.cli``)."""

import sys

from .cli import main

sys.exit(main())
