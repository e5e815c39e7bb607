"""``python -m goodtrace`` runs the command line."""

import sys

from goodtrace.cli import main

sys.exit(main())
