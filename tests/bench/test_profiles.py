"""bench.profiles: each arm's own time per function, from real pyinstrument sessions, and the
comparison that names where one arm's extra time went."""

import json
import time

from kvscope.bench.profiles import ArmProfiles, compare


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
    assert own["_busy"] > 0.1
    table = compare(tmp_path / "engine-traced.json", tmp_path / "engine-untraced.json")
    assert table.startswith("per batch: traced ")
    function_rows = table.split("| function (own time) |")[1].splitlines()[2:]
    assert function_rows[0].startswith("| `_busy (")  # about +60 ms a batch
    difference = float(function_rows[0].rsplit("|", 2)[1])
    assert 30 < difference < 120
    assert "_extra_work" in (tmp_path / "engine-traced.txt").read_text()
