"""Prints vLLM's model redirect (VLLM_MODEL_REDIRECT_PATH, JSON) for every model config under a
folder laid out as <org>/<name>/config.json: the name a test gives -> the local folder.

python scripts/vllm_tests/redirect.py scripts/vllm_tests/hub > redirect.json
"""

import json
import sys
from pathlib import Path


def redirects(hub: Path) -> dict[str, str]:
    """ "org/name" -> the absolute folder holding that model's config.json."""
    return {
        f"{config.parent.parent.name}/{config.parent.name}": str(config.parent.resolve())
        for config in sorted(hub.glob("*/*/config.json"))
    }


if __name__ == "__main__":
    print(json.dumps(redirects(Path(sys.argv[1])), indent=2))
