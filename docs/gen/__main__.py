"""`python -m docs.gen [--check]`: writes (or checks) docs/reference/*.md."""

import sys

from docs.gen.pages import main

sys.exit(main(sys.argv[1:]))
