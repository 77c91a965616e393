"""allow_amx: where the CPU has AMX tiles, Linux lets the process use them afterwards."""

import json
import platform
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.timeout(120)

# Run in a fresh process: an earlier test's oneDNN multiply may have asked already.
_PROBE = """
import ctypes, json
from kvscope.connector.common.cpu_amx import allow_amx
libc = ctypes.CDLL(None, use_errno=True)
def permitted():  # arch_prctl(ARCH_GET_XCOMP_PERM): the XSAVE features this process may use
    bits = ctypes.c_ulong(0)
    assert libc.syscall(158, 0x1022, ctypes.byref(bits)) == 0
    return bool(bits.value >> 18 & 1)  # XFEATURE_XTILEDATA
before = permitted()  # False here when torch's import asked nothing (torch 2.13)
print(json.dumps([before, allow_amx(), permitted(), allow_amx()]))
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() != "x86_64",
    reason="AMX permission is asked of Linux on x86-64",
)
def test_amx_tiles_are_permitted_after_allow_amx_where_the_cpu_has_them():
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    _before, allowed, after, again = json.loads(done.stdout.strip().splitlines()[-1])
    if not torch.cpu._is_amx_tile_supported():
        assert (allowed, again) == (False, False)
        return
    assert allowed and after and again
