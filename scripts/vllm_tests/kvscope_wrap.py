"""A pytest plugin for vLLM's own tests: every KVTransferConfig a test file builds is rewritten as
a user would write it wrapped by kvscope; configs vLLM builds itself are left alone.

KVSCOPE_VLLM_TESTS_WRAP picks the wrapper:
- traced: `kv_connector="X"` (module path M, if any) becomes `kv_connector="M.X"` with
  `kv_connector_module_path="kvscope.connector.traced_as"` (connector/traced_as.py);
- multi: kvscope's Multi under vLLM's name (`MultiConnector` of kvscope.connector.multi.connector)
  with X as its one child; vLLM's MultiConnector becomes kvscope's with the same children.
Every other field and the extra config are kept. KVSCOPE_VLLM_TESTS is the vLLM tests folder
being run (configs built elsewhere are vLLM's own). Loaded with `-p kvscope_wrap`.
"""

import os
import sys
from pathlib import Path
from typing import Any

TRACED_AS = "kvscope.connector.traced_as"
MULTI = "kvscope.connector.multi.connector"
OURS = (TRACED_AS, MULTI)


def traced(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The fields of a user's traced config for the same connector."""
    name = kwargs.get("kv_connector")
    module_path = kwargs.get("kv_connector_module_path")
    if not name or module_path in OURS:
        return kwargs
    wrapped = f"{module_path}.{name}" if module_path else name
    return {**kwargs, "kv_connector": wrapped, "kv_connector_module_path": TRACED_AS}


def multi(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The fields of kvscope's Multi over the same connector (or the same children)."""
    name = kwargs.get("kv_connector")
    module_path = kwargs.get("kv_connector_module_path")
    if not name or module_path in OURS:
        return kwargs
    if name == "MultiConnector" and not module_path:
        return {**kwargs, "kv_connector_module_path": MULTI}
    child = {
        "kv_connector": name,
        "kv_role": kwargs.get("kv_role"),
        "kv_connector_extra_config": kwargs.get("kv_connector_extra_config") or {},
    }
    if module_path:
        child["kv_connector_module_path"] = module_path
    return {
        **kwargs,
        "kv_connector": "MultiConnector",
        "kv_connector_module_path": MULTI,
        "kv_connector_extra_config": {"connectors": [child]},
    }


WRAPS = {"traced": traced, "multi": multi}


def pytest_configure(config: Any) -> None:
    from vllm.config.kv_transfer import KVTransferConfig

    wrap = WRAPS[os.environ["KVSCOPE_VLLM_TESTS_WRAP"]]
    tests_root = str(Path(os.environ["KVSCOPE_VLLM_TESTS"]).resolve())
    built = KVTransferConfig.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        caller = sys._getframe(1).f_code.co_filename
        if not args and caller.startswith(tests_root):
            kwargs = wrap(kwargs)
        built(self, *args, **kwargs)

    KVTransferConfig.__init__ = __init__
