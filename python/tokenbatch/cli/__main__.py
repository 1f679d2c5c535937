"""``python -m tokenbatch.cli``."""

import sys

from tokenbatch.cli import main

sys.exit(main())
