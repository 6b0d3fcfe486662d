"""python -m precaudit.checkpoint ARGS: `precaudit scales ARGS` until the command line registers it."""

import sys

from .command import scales_main

sys.exit(scales_main(sys.argv[1:]))
