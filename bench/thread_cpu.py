"""The same item's CPU time in a Pool process, and in a Dask worker's threads.

    python bench/thread_cpu.py [--rounds 4] [--items 200] [--vanilla]

Why the rollouts of `bench/simulation.py` trail a forked Pool even where nothing waits: each
place below runs `--items` CartPole items (20 episodes, 8 vectorised envs: the simulation
benchmark's item) back to back in one thread, and reports that thread's CPU time per item
(`time.thread_time`, which leaves out what other threads and processes use):

- a forked `multiprocessing.Pool` process, on its main thread and on a second thread;
- a worker of a cluster (nbcluster's, or with ``--vanilla`` Dask's own `LocalCluster`):
  in a Dask task (the worker's executor thread, where items run), in a thread that task
  starts, and on the worker's event-loop thread itself (`Client.run`, which blocks the loop
  while it runs).

Medians of the rounds after the first.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from typing import Any


def _make() -> Any:
    import gymnasium as gym

    return gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")


def _play(envs: Any, seed: int) -> None:
    import numpy as np

    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    done = 0
    while done < 20:
        _, _, terminated, truncated, _ = envs.step(envs.action_space.sample())
        done += int(np.count_nonzero(terminated | truncated))


def loop(n: int) -> float:
    """ms of this thread's CPU per item, over `n` items on one environment."""
    envs = _make()
    _play(envs, 0)
    began = time.thread_time()
    for i in range(n):
        _play(envs, i)
    return (time.thread_time() - began) / n * 1e3


def in_thread(n: int) -> float:
    """`loop` in a new thread of this process."""
    out: list[float] = []
    t = threading.Thread(target=lambda: out.append(loop(n)))
    t.start()
    t.join()
    return out[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--vanilla", action="store_true", help="Dask's own LocalCluster, not nbcluster's")
    args = parser.parse_args()
    n = args.items
    pool = multiprocessing.get_context("fork").Pool(1)
    if args.vanilla:
        from distributed import Client, LocalCluster

        cluster: Any = LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None)
        client = Client(cluster)
        stop = lambda: (client.close(), cluster.close())  # noqa: E731
    else:
        import nbcluster
        from nbcluster import _current

        os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
        handle = nbcluster.start(workers=1, threads=1, name="bench-thread-cpu")
        client = _current.client_for()
        stop = handle.stop
    places = {
        "Pool process, main thread": lambda: pool.apply(loop, (n,)),
        "Pool process, second thread": lambda: pool.apply(in_thread, (n,)),
        "Dask task (the executor thread)": lambda: client.submit(loop, n, pure=False).result(),
        "thread started by a Dask task": lambda: client.submit(in_thread, n, pure=False).result(),
        "worker's event-loop thread": lambda: next(iter(client.run(loop, n).values())),
    }
    got: dict[str, list[float]] = {name: [] for name in places}
    try:
        for _ in range(args.rounds):
            for name, run in places.items():
                got[name].append(run())
    finally:
        pool.close()
        stop()
    kind = "Dask's LocalCluster" if args.vanilla else "nbcluster's cluster"
    print(f"CPU ms per item of its thread, {kind}, median of rounds 2-{args.rounds} "
          f"(load {os.getloadavg()[0]:.1f}):")  # fmt: skip
    for name, ms in got.items():
        print(f"  {name:34s} {statistics.median(ms[1:]):.2f}  ({', '.join(f'{m:.2f}' for m in ms)})")


if __name__ == "__main__":
    main()
