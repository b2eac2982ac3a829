"""What the teaching notebooks share: sizes, core counts, and timings that know when they were disturbed.

A timing on a shared machine means something only if nothing else competed for the cores
meanwhile. `timed` measures a run and how many cores' worth of CPU *other programs* used
during it; `best_times` takes several runs in turns (A, B, A, B, ...) so that a slow spell of
the machine hits them alike, and keeps the fastest of each; `undisturbed` says whether the
speed checks may run.

"Other programs" leaves out everything that works *for* the notebook: this kernel and its
descendants (the cluster's supervisor and workers), its ancestors (the Jupyter server that
relays the live view, the terminal or test runner that started it) and the web browsers
drawing it. Without that, the browser redrawing the live graphs and the server relaying them
counted as a disturbance, and small mode on a laptop skipped every speed check. A video
playing in another browser tab is therefore not seen: the notebooks say so.

The busy time of the machine comes from ``/proc/stat`` (through psutil), which in a container
is the host's: on a busy shared host the checks are skipped, as they should be.

Where the notebooks run their cluster is the instructor's choice: a profile named ``course``
in Dask config (``nbcluster.profiles.course``: a course SLURM partition, a gateway, or the
hub's site config in ``/etc/dask``), with ``workers:`` beside its options, moves every notebook
there (`start_args`), with that many workers (`workers`) and scaling sweeps up to them
(`sweep`). Without it a notebook starts one worker per core of this machine, at most 4.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import psutil

from nbcluster import config
from nbcluster.cluster import profiles

if TYPE_CHECKING:
    from nbcluster.cluster.profiles import Profile

#: Process names (lower case, prefixes) of web browsers, whose CPU counts as the notebook's.
BROWSERS = (
    "chrome",
    "chromium",
    "firefox",
    "safari",
    "msedge",
    "microsoft edge",
    "brave",
    "opera",
    "vivaldi",
)
#: Cores other programs may use during a timing before its speed check is skipped.
LIMIT = 0.25
#: The profile (``nbcluster.profiles.course`` in Dask config) an instructor sets for the course.
COURSE = "course"
#: Workers a notebook starts on this machine without a course profile (a course hub's usual limit).
LAPTOP_CAP = 4
#: The largest number of workers a scaling sweep goes to.
SWEEP_LIMIT = 64


def small() -> bool:
    """Whether the notebooks should run their quick sizes.

    Returns
    -------
    bool
        True when ``NBCLUSTER_SMALL`` is set to anything but ``""`` or ``"0"`` (the test suite
        sets it).
    """
    return os.environ.get("NBCLUSTER_SMALL", "") not in ("", "0")


def cores() -> int:
    """Cores this process may use.

    Dask's ``CPU_COUNT`` (which respects CPU affinity and a container's CPU quota, as on
    Binder or a hub), and no more than the physical cores (two hyperthreads of one core do
    not compute twice as fast).

    Returns
    -------
    int
        At least 1.
    """
    from dask.system import CPU_COUNT

    return max(1, min(CPU_COUNT, psutil.cpu_count(logical=False) or CPU_COUNT))


def course_profile() -> Profile | None:
    """The instructor's course profile, if Dask config declares one.

    Returns
    -------
    Profile or None
        ``nbcluster.profiles.course``, parsed; None when there is none.

    Raises
    ------
    nbcluster.errors.BadArgument
        When it is declared but malformed (one line naming the fix).
    """
    if COURSE not in (config.get("profiles") or {}):
        return None
    return profiles.get(COURSE)


def workers(cap: int = LAPTOP_CAP) -> int:
    """How many workers a notebook starts.

    On a non-local course profile (see the module docstring), the ``workers:`` it declares
    (default `cap`): those workers run elsewhere, so this machine's cores do not bound them.
    Otherwise one single-threaded worker per core of this machine, at most `cap` (or at most
    a local course profile's ``workers:``).

    Parameters
    ----------
    cap : int
        At most this many on this machine (a course hub's usual limit).

    Returns
    -------
    int
        At least 1.
    """
    profile = course_profile()
    if profile is not None and not profile.local:
        return profile.workers or cap
    if profile is not None and profile.workers:
        cap = profile.workers
    return local_workers(cap)


def local_workers(cap: int = LAPTOP_CAP) -> int:
    """How many workers a notebook that must run on this machine starts, whatever the course
    profile says: one single-threaded worker per core, at most `cap`.

    For the notebooks whose lessons need the workers here: 07 and 09 kill worker processes by
    their process id, 05 simulates GPUs with local processes, 03 and 07 keep logs (and 03 its
    checkpoints) on this machine's disk.

    Parameters
    ----------
    cap : int
        At most this many.

    Returns
    -------
    int
        ``min(cores(), cap)``, at least 1.
    """
    return max(1, min(cores(), cap))


def remote() -> bool:
    """Whether the notebooks' workers run elsewhere (a non-local course profile).

    Returns
    -------
    bool
        True on a course profile whose backend is not ``local``: this machine's cores, caches
        and load then say nothing about the workers' (a notebook skips what measures them).
    """
    profile = course_profile()
    return profile is not None and not profile.local


def start_args() -> str:
    """The arguments of the notebooks' ``%cluster start`` (``%cluster start $START``).

    Returns
    -------
    str
        ``--workers N`` on this machine, ``--profile course --workers N`` with a course
        profile.
    """
    n = workers()
    return f"--profile {COURSE} --workers {n}" if course_profile() is not None else f"--workers {n}"


def sweep(limit: int = SWEEP_LIMIT) -> list[int]:
    """The worker counts a scaling sweep measures: powers of two up to the cluster's size.

    Parameters
    ----------
    limit : int
        No sweep goes past this many workers.

    Returns
    -------
    list of int
        1, 2, 4, ... below ``min(workers(), limit)``, then that number itself: ``[1, 2]`` on a
        2-core laptop, ``[1, 2, 4, 8, 16, 32, 64]`` on a course profile of 64 workers.
    """
    top = max(1, min(workers(), limit))
    found = [1 << k for k in range(top.bit_length()) if 1 << k < top]
    return [*found, top]


def cache_bytes(cpu: int = 0) -> int | None:
    """The size of the largest cache of one core (the last level, usually shared by all cores).

    A kernel that is meant to wait for main memory must stream over more than this. On a
    laptop it is a few MiB; on a server it can reach hundreds, so a fixed "large" array may
    fit in it, and then it is not memory-bound at all.

    Parameters
    ----------
    cpu : int
        Which core's caches to read (Linux's ``/sys/devices/system/cpu/cpuN/cache``).

    Returns
    -------
    int or None
        Bytes, or None where the operating system does not say (macOS, Windows).
    """
    sizes = _getconf_caches()
    for index in Path(f"/sys/devices/system/cpu/cpu{cpu}/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if text[-1:].upper() in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1].upper()])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes, default=None)


def _getconf_caches() -> list[int]:
    """The caches glibc reports (from the processor itself). A virtual machine's kernel may say
    less in sysfs than the processor does (32 MiB against 384 MiB of L3 here): the larger is
    the one an array must outgrow."""
    sizes = []
    for level in ("LEVEL1_DCACHE_SIZE", "LEVEL2_CACHE_SIZE", "LEVEL3_CACHE_SIZE", "LEVEL4_CACHE_SIZE"):
        try:
            text = subprocess.run(["getconf", level], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):  # no getconf (macOS has another): sysfs alone
            continue
        if text.isdigit() and int(text) > 0:
            sizes.append(int(text))
    return sizes


class Timing(NamedTuple):
    """One timed run: wall seconds, cores other programs used meanwhile, and its result."""

    seconds: float
    others: float
    result: Any


def _is_browser(proc: psutil.Process) -> bool:
    try:
        return proc.name().lower().startswith(BROWSERS)
    except psutil.Error:
        return False


def ours(me: psutil.Process | None = None) -> list[psutil.Process]:
    """The processes working for this notebook (see the module docstring).

    Parameters
    ----------
    me : psutil.Process, optional
        The kernel's process (default: this one).

    Returns
    -------
    list of psutil.Process
        It, its descendants, its ancestors, and every web browser's process.
    """
    me = me or psutil.Process()
    found = {p.pid: p for p in [me, *me.children(recursive=True), *me.parents()]}
    for proc in psutil.process_iter():
        if proc.pid not in found and _is_browser(proc):
            found[proc.pid] = proc
    return list(found.values())


def _cpu_seconds(procs: Iterable[psutil.Process]) -> tuple[float, dict[int, float]]:
    """(busy CPU seconds of the whole machine, CPU seconds of each of `procs` by pid)."""
    c = psutil.cpu_times()
    # busy time of all cores, plus time a virtual machine's host gave to someone else (steal)
    machine = sum(getattr(c, f, 0.0) for f in ("user", "system", "nice", "irq", "softirq", "steal"))
    used = {}
    for p in procs:
        try:
            t = p.cpu_times()
            # With the children it has waited for: a program the notebook runs and waits for
            # (torchrun under `subprocess.run`) is its own work, gone before the run's end.
            used[p.pid] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return machine, used


def timed(run: Callable[[], Any], *, _ours: Callable[[], list[psutil.Process]] = ours) -> Timing:
    """Run `run()` and time it, with how many cores' worth of CPU other programs used meanwhile.

    Processes of ours that start during the run (a new worker) are counted from zero; those
    that end during it count through the children times of the process of ours that waited
    for them (a program run with `subprocess.run`); one whose parent is not ours loses its
    share, which can only make a run look *more* disturbed.

    Parameters
    ----------
    run : callable
        Called once, without arguments.
    _ours : callable
        Test seam: what counts as the notebook's own processes (default `ours`).

    Returns
    -------
    Timing
        Wall seconds, cores other programs used on average during them, and ``run()``'s result.
    """
    before = _ours()
    machine0, used0 = _cpu_seconds(before)
    start = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - start
    after = {p.pid: p for p in [*before, *_ours()]}.values()
    machine1, used1 = _cpu_seconds(after)
    mine = sum(t - used0.get(pid, 0.0) for pid, t in used1.items())
    # One of ours that ended meanwhile is in its parent's children times for its whole life:
    # what it had used before the run is not the run's.
    mine -= sum(t for pid, t in used0.items() if pid not in used1)
    return Timing(seconds, max(0.0, (machine1 - machine0) - mine) / seconds, result)


def best_times(*runs: Callable[[], Any], repeats: int = 3) -> list[tuple[float, float]]:
    """Time several runs in turns (A, B, A, B, ...) and keep the fastest of each.

    Parameters
    ----------
    *runs : callable
        Each called `repeats` times, without arguments.
    repeats : int
        Runs of each.

    Returns
    -------
    list of (float, float)
        For each run, in order: (seconds, cores other programs used) of its fastest run.
    """
    kept: list[list[tuple[float, float]]] = [[] for _ in runs]
    for _ in range(repeats):
        for times, run in zip(kept, runs, strict=True):
            times.append(timed(run)[:2])
    return [min(times) for times in kept]


def undisturbed(*others: float, limit: float = LIMIT) -> bool:
    """Whether speed checks may run on these timings; prints why not, otherwise.

    Parameters
    ----------
    *others : float
        Cores other programs used during each timing (`Timing.others`).
    limit : float
        The most any timing may have had.

    Returns
    -------
    bool
        True if every one is under `limit`.
    """
    worst = max(others, default=0.0)
    if worst >= limit:
        print(
            f"Other programs used up to {worst:.1f} cores during these timings: the speed checks "
            "are skipped (correctness is still checked). Close what else is running and rerun to see them."
        )
    return worst < limit
