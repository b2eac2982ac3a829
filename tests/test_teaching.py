"""nbcluster.teaching, the notebooks' shared timing helper: what counts as a disturbance.

Real processes throughout: busy programs are real spinning processes, re-parented away from
this test (as a program the student did not start would be), and the "browser" is a real
process whose name is a browser's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from nbcluster import teaching
from nbcluster.errors import BadArgument
from tests.os_helpers import fresh_python


def _orphan(tmp_path: Path, name: str) -> psutil.Process:
    """A spinning Python, run as `name`, that is not a descendant of this process."""
    link = tmp_path / name
    link.symlink_to(sys.executable)
    out = subprocess.run(
        ["sh", "-c", f"{link} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    proc = psutil.Process(int(out.stdout))
    assert proc.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
    return proc


@pytest.fixture
def spinners(tmp_path: Path) -> Iterator[dict[str, psutil.Process]]:
    procs = {name: _orphan(tmp_path, name) for name in ("chromium-renderer", "compiler")}
    yield procs
    for proc in procs.values():
        proc.kill()


def test_a_busy_program_counts_as_a_disturbance(spinners: dict[str, psutil.Process]) -> None:
    # Only this process is ours here: both spinners are other programs, about 2 cores' worth
    # on a 2-core machine, and at least most of one core whatever else the machine runs.
    timing = teaching.timed(lambda: time.sleep(1.0), _ours=lambda: [psutil.Process()])
    assert timing.others > 0.6, timing
    assert not teaching.undisturbed(timing.others)


def test_the_browser_and_the_jupyter_server_work_for_the_notebook(
    spinners: dict[str, psutil.Process],
) -> None:
    mine = {p.pid for p in teaching.ours()}
    assert spinners["chromium-renderer"].pid in mine, "the browser drawing the notebook is not a disturbance"
    assert spinners["compiler"].pid not in mine, "any other program is"
    assert psutil.Process().ppid() in mine, "the process that started the kernel (the Jupyter server) is ours"


def _busy_seconds() -> float:
    c = psutil.cpu_times()
    return sum(getattr(c, f, 0.0) for f in ("user", "system", "nice", "irq", "softirq", "steal"))


def test_our_own_children_are_not_a_disturbance() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        kid = psutil.Process(child.pid)
        machine0, kid0 = _busy_seconds(), sum(kid.cpu_times()[:2])
        timing = teaching.timed(lambda: time.sleep(1.0))
        machine1, kid1 = _busy_seconds(), sum(kid.cpu_times()[:2])
    finally:
        child.kill()
        child.wait()
    # One interval, counted twice: other helpers share this machine, so no reading is zero, but
    # the child's CPU must not be among the other programs'.
    by_child = (kid1 - kid0) / timing.seconds
    everyone = (machine1 - machine0) / timing.seconds
    assert by_child > 0.2, f"the child barely ran ({by_child:.2f} cores): nothing to tell"
    assert timing.others < everyone - by_child + 0.15, (timing, everyone, by_child)


def test_a_program_we_run_and_wait_for_is_not_a_disturbance() -> None:
    # torchrun in 02: started, run and ended inside the timing, gone before it ends.
    def spin() -> None:
        subprocess.run([sys.executable, "-c", "import time\nend = time.time() + 1\nwhile time.time() < end: pass"],
                       check=True)  # fmt: skip

    machine0 = _busy_seconds()
    timing = teaching.timed(spin)
    everyone = (_busy_seconds() - machine0) / timing.seconds
    assert everyone > 0.5, f"the program barely ran ({everyone:.2f} cores): nothing to tell"
    assert timing.others < everyone - 0.5, (timing, everyone)


def test_cores_respects_the_cpu_affinity_a_container_or_taskset_gives() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores to restrict to 1")
    code = "import os; os.sched_setaffinity(0, {0}); from nbcluster import teaching; print(teaching.cores())"
    assert fresh_python(code).strip() == "1"
    assert teaching.workers(cap=1) == 1


def test_best_times_keeps_the_fastest_of_each_and_takes_turns() -> None:
    order: list[str] = []
    delays = iter([0.05, 0.01, 0.02, 0.03, 0.04, 0.02])

    def run(name: str):
        def go() -> None:
            order.append(name)
            time.sleep(next(delays))

        return go

    (a, _), (b, _) = teaching.best_times(run("a"), run("b"), repeats=3)
    assert order == ["a", "b"] * 3
    assert 0.02 <= a < 0.03 and 0.01 <= b < 0.02, (a, b)


def test_undisturbed_says_why_it_skips(capsys: pytest.CaptureFixture[str]) -> None:
    assert teaching.undisturbed(0.0, 0.1)
    assert capsys.readouterr().out == ""
    assert not teaching.undisturbed(0.1, 0.9)
    assert "0.9 cores" in capsys.readouterr().out


@pytest.mark.skipif(not Path("/sys/devices/system/cpu/cpu0/cache").is_dir(), reason="Linux's sysfs only")
def test_cache_bytes_is_the_largest_cache_the_system_reports() -> None:
    # Two readings: glibc's getconf (from the processor) and the kernel's sysfs, which a
    # virtual machine may report smaller (here 384 MiB of L3 against 32 MiB). The array a
    # memory-bound kernel streams must outgrow the larger.
    reported = []
    for level in ("LEVEL1_DCACHE_SIZE", "LEVEL2_CACHE_SIZE", "LEVEL3_CACHE_SIZE", "LEVEL4_CACHE_SIZE"):
        out = subprocess.run(["getconf", level], capture_output=True, text=True).stdout.strip()
        reported.extend([int(out)] if out.isdigit() else [])
    lscpu = subprocess.run(["lscpu", "-B", "-C=NAME,ONE-SIZE"], capture_output=True, text=True).stdout.split()
    reported.extend(int(word) for word in lscpu if word.isdigit())  # sysfs, as lscpu reads it
    if not reported:
        pytest.skip("neither getconf nor lscpu knows the caches here")
    assert teaching.cache_bytes() == max(reported)


def test_a_course_profile_sets_where_and_how_wide_the_notebooks_run() -> None:
    """Without a course profile: one worker per core, at most 4. With one (a course SLURM
    partition, a gateway, a hub's site config): its workers, past the laptop cap, and sweeps
    up to them."""
    import dask.config

    laptop = teaching.workers()
    assert laptop == min(teaching.cores(), teaching.LAPTOP_CAP)
    assert teaching.start_args() == f"--workers {laptop}" and not teaching.remote()
    assert teaching.sweep()[-1] == laptop and teaching.sweep()[0] == 1
    course = {"backend": "slurm", "description": "the course partition", "options": {"queue": "course"}}
    with dask.config.set({"nbcluster.profiles.course": {**course, "workers": 64}}):
        assert teaching.workers() == 64 and teaching.remote()
        assert teaching.start_args() == "--profile course --workers 64"
        assert teaching.sweep() == [1, 2, 4, 8, 16, 32, 64]
        assert teaching.sweep(limit=12) == [1, 2, 4, 8, 12]
    with dask.config.set({"nbcluster.profiles.course": {**course, "workers": 6}}):
        assert teaching.sweep() == [1, 2, 4, 6]
    with dask.config.set({"nbcluster.profiles.course": {"backend": "local", "workers": 1}}):
        assert teaching.workers() == 1 and not teaching.remote()  # a local profile: this machine's cores
    with (
        dask.config.set({"nbcluster.profiles.course": {**course, "workers": "many"}}),
        pytest.raises(BadArgument, match="workers must be a whole number of at least 1, not 'many'"),
    ):
        teaching.workers()


def test_notebooks_that_kill_workers_by_pid_stay_on_this_machine() -> None:
    import dask.config

    course = {"backend": "slurm", "options": {"queue": "course"}, "workers": 64}
    with dask.config.set({"nbcluster.profiles.course": course}):
        assert teaching.workers() == 64
        assert teaching.local_workers() == min(teaching.cores(), teaching.LAPTOP_CAP)
