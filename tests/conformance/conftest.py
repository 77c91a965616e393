"""The conformance tests read vLLM itself: where vLLM is not installed (the GPU machine's image)
none of them is collected."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["*.py"]
