"""Writes docs/reference/*.md from the code; `--check` fails listing the pages that differ."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from docs.gen.pages import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
