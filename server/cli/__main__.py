"""``python -m server.cli``: the same as the ``wafervox`` console script."""

import sys

from . import main

sys.exit(main())
