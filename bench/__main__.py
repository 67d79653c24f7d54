"""`python -m bench NAME [flags]`: see bench/README.md."""

from __future__ import annotations

import sys

from bench import main

sys.exit(main())
