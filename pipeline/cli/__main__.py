"""``python -m pipeline.cli``: the `pipeline` command."""

import sys

from pipeline.cli import main

sys.exit(main())
