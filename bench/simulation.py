"""Rollouts: CartPole episodes a second, per-worker vectorised environments against a forked Pool.

    python bench/simulation.py [--rounds 3] [--items 64 [256 ...]] [--episodes 20] [--ray] [--write]
    python bench/simulation.py --timeline [--items 64]   # where a round's time goes

Each item plays `--episodes` CartPole-v1 episodes (random actions) on a vectorised
environment of 8 (`gym.make_vec`, synchronous), and returns how many it finished. The
peers, interleaved round by round, on 2 processes each:

- nbcluster: a local cluster of 2 workers x 1 thread; each item gets its worker's
  environment through `nbcluster.worker_local` (built once per worker);
- a forked `multiprocessing.Pool(2)`: each process builds its environment in the Pool's
  `initializer`, once.

- with ``--ray``: Ray's `ActorPool` of 2 actors on a local Ray of 2 CPUs, each actor
  building its environment once, in its ``__init__``. Ray is a peer, not a dependency:
  ``pip install "ray[tune]"``.

nbcluster runs with its defaults (a run's first ten seconds of batches go to the workers
directly, one a thread, `distribute.direct`). Medians of the rounds; `--write` replaces the `## simulation`
section of bench/RESULTS.md. ``DASK_NBCLUSTER__WORKER__FORKSERVER=false`` in the environment
starts the workers as new Pythons instead of forking them from the supervisor's forkserver.

`--timeline` runs one warm-up and one timed round of nbcluster and of the Pool, each item
reporting its process, its batch (a Pool task is one item) and when it started and ended
(and its thread's CPU time), and prints for each process its batches: when the first item
started, the gaps between batches, when the last one ended, and how long the result took
to come back.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import multiprocessing
import os
import statistics
import tempfile
import time
from typing import Any

ENVS = 8
_ENV: Any = None  # the Pool process's environment (its initializer builds it)


def make() -> Any:
    import gymnasium as gym

    return gym.make_vec("CartPole-v1", num_envs=ENVS, vectorization_mode="sync")


def play(envs: Any, episodes: int, seed: int) -> int:
    """Step `envs` with random actions until `episodes` episodes ended; how many did."""
    import numpy as np

    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    done = 0
    while done < episodes:
        _, _, terminated, truncated, _ = envs.step(envs.action_space.sample())
        done += int(np.count_nonzero(terminated | truncated))
    return done


def on_worker(i: int, episodes: int) -> int:
    import nbcluster

    return play(nbcluster.worker_local("bench-cartpole", make), episodes, i)


def on_worker_timed(i: int, episodes: int) -> Stamp:
    """`on_worker`, stamped: (pid, batch, start, end, thread CPU seconds, episodes).

    The batch is named by its key (``distribute-<run>-<n>``), which a direct batch's thread
    carries as a task's does (`nbcluster._compat.as_worker`).
    """
    from dask.context import thread_state

    import nbcluster

    key = str(getattr(thread_state, "key", ""))
    return _stamped(lambda: play(nbcluster.worker_local("bench-cartpole", make), episodes, i), key)


def in_pool_timed(args: tuple[int, int]) -> Stamp:
    return _stamped(lambda: play(_ENV, args[1], args[0]), str(args[0]))  # chunksize 1: a task an item


Stamp = tuple[int, str, float, float, float, int]


def _stamped(item: Any, batch: str) -> Stamp:
    began, cpu = time.time(), time.thread_time()
    value = item()
    return os.getpid(), batch, began, time.time(), time.thread_time() - cpu, value


def timeline(name: str, began: float, ended: float, stamps: list[Stamp]) -> list[str]:
    """Each process's batches (a Pool's task is one item) as [start-end: items], in ms from the start."""
    lines = [f"{name}: {1e3 * (ended - began):.0f} ms for {len(stamps)} items"]
    for pid in sorted({s[0] for s in stamps}):
        mine = sorted((s for s in stamps if s[0] == pid), key=lambda s: s[2])
        runs: list[list[Stamp]] = [[mine[0]]]
        for before, after in itertools.pairwise(mine):
            (runs[-1].append(after) if after[1] == before[1] else runs.append([after]))  # fmt: skip
        busy = sum(s[3] - s[2] for s in mine)
        gaps = sum(b[0][2] - a[-1][3] for a, b in itertools.pairwise(runs))
        lines.append(
            f"  pid {pid}: {len(mine)} items, first starts at {1e3 * (mine[0][2] - began):.1f}, last ends at "
            f"{1e3 * (mine[-1][3] - began):.1f}; per item {1e3 * busy / len(mine):.2f} ms "
            f"(CPU {1e3 * sum(s[4] for s in mine) / len(mine):.2f}); {len(runs)} tasks, {1e3 * gaps:.1f} ms between"
        )
        lines.append("    " + " ".join(
            f"[{1e3 * (r[0][2] - began):.0f}-{1e3 * (r[-1][3] - began):.0f}: {len(r)}]" for r in runs))  # fmt: skip
    lines.append(f"  the result back {1e3 * (ended - max(s[3] for s in stamps)):.1f} ms after the last item ended")
    return lines


def _commit() -> str:
    """The checkout's commit, for the results' record ("unknown" outside git)."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def _init() -> None:
    global _ENV
    _ENV = make()


def in_pool(args: tuple[int, int]) -> int:
    return play(_ENV, args[1], args[0])


def ray_pool() -> Any:
    """Ray's peer: an `ActorPool` of 2 actors, one environment each (built in ``__init__``)."""
    import ray
    from ray.util import ActorPool

    @ray.remote(num_cpus=1)
    class Player:
        def __init__(self) -> None:
            self.envs = make()

        def play(self, i: int, episodes: int) -> int:
            return play(self.envs, episodes, i)

    return ActorPool([Player.remote() for _ in range(2)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--items", type=int, nargs="+", default=[64], help="one size or several (64 256)")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--ray", action="store_true", help="also Ray's ActorPool (pip install 'ray[tune]')")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--timeline", action="store_true", help="where one round's time goes, item by item")
    args = parser.parse_args()

    import nbcluster

    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    load_before = os.getloadavg()[0]
    cluster = nbcluster.start(workers=2, threads=1, name="bench-simulation")
    pool = multiprocessing.get_context("fork").Pool(2, initializer=_init)
    peers = ["nbcluster (worker_local)", "forked Pool (initializer)"]
    actors = None
    if args.ray:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        actors = ray_pool()
        peers.append("Ray ActorPool (actor __init__)")
    rates = {(size, name): [] for size in args.items for name in peers}  # episodes/s of each counted round
    try:
        if args.timeline:
            for r in range(2):  # the first warms up
                for name in ("nbcluster", "forked Pool"):
                    began = time.time()
                    if name == "nbcluster":
                        work = functools.partial(on_worker_timed, episodes=args.episodes)
                        stamps = list(nbcluster.distribute(work, over=range(args.items[0])).values())
                    else:
                        stamps = pool.map(in_pool_timed, [(i, args.episodes) for i in range(args.items[0])], chunksize=1)
                    if r:
                        print("\n".join(timeline(name, began, time.time(), stamps)))
            return
        for size in args.items:
            for r in range(args.rounds + 1):  # round 0 warms both up (imports, environments): not counted
                for name in peers[r % len(peers):] + peers[: r % len(peers)]:  # interleaved, each first in turn
                    began = time.perf_counter()
                    if name.startswith("nbcluster"):
                        runs = nbcluster.distribute(functools.partial(on_worker, episodes=args.episodes),
                                                    over=range(size))  # fmt: skip
                        total = sum(runs.values())
                    elif name.startswith("Ray"):
                        assert actors is not None
                        total = sum(actors.map(lambda a, i: a.play.remote(i, args.episodes), range(size)))
                    else:
                        total = sum(pool.map(in_pool, [(i, args.episodes) for i in range(size)], chunksize=1))
                    rate = total / (time.perf_counter() - began)
                    if r:
                        rates[size, name].append(rate)
                    print(f"{size} items, round {r}, {name}: {rate:,.0f} episodes/s")
    finally:
        pool.close()
        pool.join()
        cluster.stop()
        if actors is not None:
            import ray

            ray.shutdown()
    medians = {k: statistics.median(v) for k, v in rates.items()}
    lines = [
        f"Items of {args.episodes} CartPole-v1 episodes (random actions, {ENVS} envs vectorised per process), "
        f"2 processes each, {args.rounds} rounds interleaved after a warm-up; medians:",
        "",
        "| items | peer | episodes/s (median) | rounds' range | vs the Pool |",
        "|---|---|---|---|---|",
        *(f"| {size} | {n} | {m:,.0f} | {min(rates[size, n]):,.0f}-{max(rates[size, n]):,.0f} | "
          f"{m / medians[size, 'forked Pool (initializer)']:.2f}x |" for (size, n), m in medians.items()),
        "",
        *([] if args.ray else ["Ray's ActorPool was not run (`--ray`, with Ray installed, runs it)."]),
        f"Run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
        f"at commit {_commit()}; load average {load_before:.2f} at the start and {os.getloadavg()[0]:.2f} at the "
        f"end, on {os.cpu_count()} cores (above about 0.5, other work shared them: the rounds' ranges show how much).",
    ]
    body = "\n".join(lines)
    print(body)
    if args.write:
        from _results import write_section  # bench/, the script's own folder

        sizes = " ".join(map(str, args.items))
        flags = f"--rounds {args.rounds} --items {sizes} --episodes {args.episodes}" + " --ray" * args.ray
        write_section("simulation", f"python bench/simulation.py {flags} --write", body)


if __name__ == "__main__":
    main()
