"""``python -m cofrgenet ...``: the same as ``cofr ...``."""

import sys

from cofrgenet.cli import main

sys.exit(main())
