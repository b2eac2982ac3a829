"""Tuning by epochs: a full grid, nbcluster's ASHA, and Optuna's successive halving (issue 38).

    .venv/bin/python bench/tuning.py [--epochs 27] [--ray]

The problem: 64 configurations of scikit-learn's `SGDClassifier`, trained with
`partial_fit` one epoch at a time on the digits data set scikit-learn ships, up to 27
epochs, scored on a held-out fifth after each epoch. Each trial builds its data inside the
trial, in every peer. All on 2 workers x 1 thread:

- (a) the full grid through nbcluster (`--objective acc:max`, no stopper);
- (b) nbcluster with `--stop asha(grace=1, eta=3, max_t=27)`;
- (c) Ray Tune's `ASHAScheduler` (same grace, eta and max_t, by epoch), with ``--ray`` only,
  on a local Ray of 2 CPUs; Ray is a peer, not a dependency: ``pip install "ray[tune]"``;
- (d) Optuna on a 2-worker `LocalCluster`: `DaskStorage`, a `GridSampler` over the same 64
  configurations and `SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)`.

Prints each peer's wall time and best validation accuracy, and a line for RESULTS.md.

``--reports`` measures instead what 1,000 reports a second cost: 4 items of 2 s of CPU work
each (2 at a time), reporting 500 times a second each, against the same items reporting
nothing, interleaved, 3 rounds; and counts the rows the kernel received.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, ROOT)  # this checkout's nbcluster, here and on the workers
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)

GRID = {
    "alpha": [1e-5, 1e-4, 1e-3, 1e-2],
    "eta0": [0.0003, 0.003, 0.03, 0.3],
    "penalty": ["l2", "l1"],
    "loss": ["hinge", "log_loss"],
}
CONFIGS = [dict(zip(GRID, values, strict=True)) for values in itertools.product(*GRID.values())]
#: ``--small``: 16 of the 64 (the middle two values of alpha and eta0), for a run of a few
#: minutes on a shared machine, where Ray starts a process per trial actor.
SMALL = {**GRID, "alpha": [1e-4, 1e-3], "eta0": [0.003, 0.03]}


def data() -> tuple[Any, Any, Any, Any]:
    """Digits, scaled, split 4:1 (the same split in every trial)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    return train_test_split(x / 16.0, y, test_size=0.2, random_state=0)


def epochs(alpha: float, eta0: float, penalty: str, loss: str, n: int) -> Any:
    """Train one configuration, yielding (epoch, validation accuracy) after each epoch."""
    import numpy as np
    from sklearn.linear_model import SGDClassifier

    x_train, x_val, y_train, y_val = data()
    model = SGDClassifier(alpha=alpha, eta0=eta0, penalty=penalty, loss=loss,
                          learning_rate="constant", random_state=0)  # fmt: skip
    classes = np.unique(y_train)
    for epoch in range(1, n + 1):
        model.partial_fit(x_train, y_train, classes=classes)
        yield epoch, float(model.score(x_val, y_val))


def nbcluster_trial(alpha: float, eta0: float, penalty: str, loss: str, n: int) -> float:
    import nbcluster

    acc = 0.0
    for epoch, acc in epochs(alpha, eta0, penalty, loss, n):
        nbcluster.report(step=epoch, acc=acc)
    return acc


def run_nbcluster(n: int, stopper: str | None) -> tuple[float, float, int]:
    import nbcluster

    grid = {**GRID, "n": [n]}
    began = time.perf_counter()
    runs = nbcluster.distribute(nbcluster_trial, grid=grid, objective="acc:max", stopper=stopper)
    took = time.perf_counter() - began
    stopped = sum(state == "stopped" for state in runs.states)
    return took, runs.best().value, stopped


def run_optuna(n: int) -> tuple[float, float, int]:
    import optuna
    from distributed import Client, LocalCluster, wait
    from optuna_integration import DaskStorage

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def objective(trial: Any) -> float:
        params = {name: trial.suggest_categorical(name, values) for name, values in GRID.items()}
        acc = 0.0
        for epoch, acc in epochs(**params, n=n):
            trial.report(acc, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return acc

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as client:
        client.submit(data).result()  # workers warm (imports), as nbcluster's are after its first cell
        began = time.perf_counter()
        study = optuna.create_study(
            storage=DaskStorage(client=client), direction="maximize",
            sampler=optuna.samplers.GridSampler(GRID, seed=0),
            pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3),
        )  # fmt: skip
        futures = [client.submit(study.optimize, objective, n_trials=len(CONFIGS) // 2, pure=False) for _ in range(2)]
        wait(futures)
        took = time.perf_counter() - began
        pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
        return took, float(study.best_value), pruned


def run_ray(n: int) -> tuple[float, float, int] | None:
    """(c): Ray Tune's `ASHAScheduler` over the same grid, on a local Ray of 2 CPUs (one a trial)."""
    try:
        import ray
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler
    except ImportError:
        print('Ray Tune does not import: pip install "ray[tune]" (a benchmark peer only, not a dependency)')
        return None
    import tempfile

    def trainable(config: dict[str, Any]) -> None:
        for _, acc in epochs(**config, n=n):
            tune.report({"acc": acc})

    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as e:  # under heavy load the local Ray may not come up in its own time
        print(f"Ray did not start: {type(e).__name__}: {e}")
        ray.shutdown()
        return None
    try:
        # Workers warm (imports), as nbcluster's and Optuna's are before they are timed.
        ray.get([ray.remote(data).remote() for _ in range(2)])
        began = time.perf_counter()
        tuner = tune.Tuner(
            trainable, param_space={k: tune.grid_search(v) for k, v in GRID.items()},
            tune_config=tune.TuneConfig(metric="acc", mode="max", reuse_actors=True,
                                        scheduler=ASHAScheduler(time_attr="training_iteration", max_t=n,
                                                                grace_period=1, reduction_factor=3)),
            run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(prefix="bench-ray-"), verbose=0),
        )  # fmt: skip
        results = tuner.fit()
        took = time.perf_counter() - began
        stopped = sum(r.metrics.get("training_iteration", n) < n for r in results)
        return took, float(results.get_best_result().metrics["acc"]), stopped
    finally:
        ray.shutdown()


def busy(x: int, report: bool) -> int:
    """2 s of CPU work, in 1,000 slices; with `report`, a report after each (500 a second)."""
    import time

    import nbcluster

    deadline = time.perf_counter()
    for step in range(1, 1001):
        deadline += 0.002
        while time.perf_counter() < deadline:
            pass
        if report:
            nbcluster.report(step=step, loss=1.0 / step)
    return x


def run_reports() -> None:
    import statistics

    import nbcluster

    cluster = nbcluster.start(workers=2, threads=1)
    try:
        nbcluster.distribute(busy, grid={"x": [0, 1], "report": [True]}, objective="loss:min")  # warm
        times: dict[bool, list[float]] = {True: [], False: []}
        rows = []
        for _ in range(3):
            for report in (False, True):
                began = time.perf_counter()
                runs = nbcluster.distribute(busy, grid={"x": [0, 1, 2, 3], "report": [report]}, objective="loss:min")
                times[report].append(time.perf_counter() - began)
                if report:
                    rows.append(len(runs.metrics))
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(f"| reports off | {off:.2f} s |\n| reports on (1,000/s) | {on:.2f} s ({on / off:.3f}x) |")
        print(f"rows received per run: {rows} (of 4000)")
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=27)
    parser.add_argument("--ray", action="store_true", help="also Ray Tune, if it imports")
    parser.add_argument("--small", action="store_true", help="16 configurations instead of 64")
    parser.add_argument("--reports", action="store_true", help="measure the cost of 1,000 reports a second")
    args = parser.parse_args()
    if args.reports:
        run_reports()
        return
    if args.small:
        global GRID, CONFIGS
        GRID = SMALL
        CONFIGS = [dict(zip(GRID, values, strict=True)) for values in itertools.product(*GRID.values())]
    import nbcluster

    rows: list[tuple[str, float, float, int]] = []
    cluster = nbcluster.start(workers=2, threads=1)
    try:
        nbcluster.distribute(lambda x: data() and x, over=[0, 1])  # workers warm (imports)
        took, best, _ = run_nbcluster(args.epochs, None)
        rows.append(("(a) nbcluster, full grid", took, best, 0))
        print(rows[-1], flush=True)  # each peer's row as it ends: a later peer may fail
        took, best, stopped = run_nbcluster(args.epochs, f"asha(grace=1, eta=3, max_t={args.epochs})")
        rows.append(("(b) nbcluster --stop asha", took, best, stopped))
        print(rows[-1], flush=True)
    finally:
        cluster.stop()
    if args.ray and (ray := run_ray(args.epochs)) is not None:
        rows.append(("(c) Ray Tune ASHAScheduler", *ray))
        print(rows[-1], flush=True)
    rows.append(("(d) Optuna DaskStorage + SuccessiveHalvingPruner", *run_optuna(args.epochs)))
    full = rows[0][1]
    print(f"{len(CONFIGS)} configurations, up to {args.epochs} epochs")
    print("| peer | wall s | ratio to (a) | best val. accuracy | trials stopped early |")
    print("|---|---|---|---|---|")
    for name, took, best, stopped in rows:
        print(f"| {name} | {took:.2f} | {took / full:.2f}x | {best:.3f} | {stopped} |")


if __name__ == "__main__":
    main()
