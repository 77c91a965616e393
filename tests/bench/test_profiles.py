"""bench.profiles: each arm's own time per function, from real pyinstrument sessions and a real
py-spy recording, and the comparison that names where one arm's extra time went."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from kvscope.bench.common.profiles import ArmProfiles, compare, from_py_spy


def _busy(seconds: float) -> int:
    """Python work (calls included, so the profiler samples it) for about `seconds`."""
    end, count = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        count += len(str(count))
    return count


def _extra_work() -> int:
    return _busy(0.06)


def test_an_arms_extra_function_tops_the_comparison(tmp_path):
    profiles = ArmProfiles()
    for _ in range(3):
        with profiles.around("traced"):
            _busy(0.03)
            _extra_work()
        with profiles.around("untraced"):
            _busy(0.03)
    written = profiles.write(tmp_path, "engine")
    assert sorted(path.name for path in written) == [
        "engine-traced.json",
        "engine-traced.txt",
        "engine-untraced.json",
        "engine-untraced.txt",
    ]
    traced = json.loads((tmp_path / "engine-traced.json").read_text())
    assert traced["batches"] == 3
    assert 0.2 < traced["duration_s"] < 2  # three batches of about 90 ms
    # Own time only: _extra_work calls _busy, whose time is _busy's (and its callees').
    own = {name.split(" (")[0]: seconds for name, seconds in traced["functions"].items()}
    assert own.get("_extra_work", 0) < 0.02
    inclusive = {name.split(" (")[0]: seconds for name, seconds in traced["inclusive"].items()}
    assert 0.12 < inclusive["_extra_work"] < inclusive["_busy"]  # 3 x 60 ms of its callee's
    assert own["_busy"] > 0.1
    table = compare(tmp_path / "engine-traced.json", tmp_path / "engine-untraced.json")
    assert table.startswith("per batch: traced ")
    function_rows = table.split("| function (own time) |")[1].splitlines()[2:]
    assert function_rows[0].startswith("| `_busy (")  # about +60 ms a batch
    difference = float(function_rows[0].rsplit("|", 2)[1])
    assert 30 < difference < 120
    assert "_extra_work" in (tmp_path / "engine-traced.txt").read_text()


def test_a_py_spy_recording_reads_as_the_same_summary(tmp_path):
    script = tmp_path / "busy.py"
    script.write_text(
        "import time\n"
        "def spin():\n"
        "    end, n = time.time() + 20, 0\n"
        "    while time.time() < end:\n"
        "        n += len(str(n))\n"
        "print('ready', flush=True)\n"
        "spin()\n"
    )
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        raw = tmp_path / "busy.raw"
        record = ["record", "--pid", str(process.pid), "--duration", "1", "--rate", "50"]
        subprocess.run(
            [_py_spy(), *record, "--format", "raw", "--nonblocking", "-o", str(raw)],
            check=True,
            capture_output=True,
            timeout=60,
        )
    finally:
        process.kill()
        process.wait(timeout=30)
    summary = json.loads(from_py_spy(raw, "busy", 1.0, 50).read_text())
    assert summary["unit"] == "s" and summary["arm"] == "busy"
    assert 0.5 < summary["duration_s"] <= 1.2  # 50 samples a second, for about a second
    top = next(iter(summary["functions"]))
    assert top == "spin (busy.py)"  # one name a function, whichever line was running


def _py_spy() -> str:
    found = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    assert found, "py-spy is a dev dependency"
    return found
