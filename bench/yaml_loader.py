"""Whether `config.libyaml` saves more than 1% of what a user waits for (bench/RESULTS.md).

``python bench/yaml_loader.py [--rounds 8]`` measures, against this checkout:

- parse: ``yaml.load(distributed.yaml)`` with PyYAML's pure loader and with libyaml's, best
  of 9, process CPU;
- supervisor: the CPU a fresh process spends in ``yaml.safe_load`` importing the supervisor
  and then refreshing Dask's config (what a supervisor does after the request), with and
  without `config.libyaml`, in turns;
- cold and warm: ``nbcluster.start(workers=2)`` from a fresh process until it returns, with no
  spare supervisor (cold) and 4 s after `launcher.prewarm` (warm), in turns against a copy of
  the package whose `libyaml` patches nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import distributed
import yaml

ROOT = Path(__file__).resolve().parent.parent

SUPERVISOR = r"""
import contextlib, sys, time, yaml
import dask.config
from nbcluster import config
spent = [0.0]
def timed(load):
    def wrapper(stream):
        t = time.process_time(); out = load(stream); spent[0] += time.process_time() - t; return out
    return wrapper
with config.libyaml() if sys.argv[1] == "patch" else contextlib.nullcontext():
    yaml.safe_load = timed(yaml.safe_load)
    import nbcluster.cluster.supervisor
    dask.config.refresh()
print(spent[0])
"""

START = r"""
import json, sys, time
import nbcluster
from nbcluster.cluster import launcher
if sys.argv[1] == "warm":
    launcher.prewarm()
    time.sleep(4)  # the spare's imports done
t = time.perf_counter()
cluster = nbcluster.start(workers=2)
took = time.perf_counter() - t
cluster.stop()
print(json.dumps(took))
"""


def parse_ms() -> dict[str, float]:
    text = (Path(distributed.__file__).parent / "distributed.yaml").read_text()
    best = {}
    for loader in (yaml.SafeLoader, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        times = []
        for _ in range(9):
            t = time.process_time()
            yaml.load(text, Loader=loader)
            times.append(time.process_time() - t)
        best[loader.__name__] = 1000 * min(times)
    return best


def unpatched_copy(folder: Path) -> Path:
    """This checkout's package, with `config.libyaml` patching nothing."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD", "nbcluster"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    path = folder / "nbcluster" / "config.py"
    text = path.read_text()
    patched = "    if SAFE_LOADER is not yaml.SafeLoader:"
    assert patched in text, "config.libyaml changed: update this benchmark"
    path.write_text(text.replace(patched, "    if False:"))
    return folder


def run(code: str, arg: str, path: Path) -> float:
    with tempfile.TemporaryDirectory() as registry:
        env = dict(os.environ, PYTHONPATH=str(path), NBCLUSTER_RUNTIME_DIR=registry)
        done = subprocess.run(
            [sys.executable, "-c", code, arg],
            env=env,
            capture_output=True,
            text=True,
            cwd=registry,
            timeout=120,
        )
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])
        return float(json.loads(done.stdout.splitlines()[-1]))


def turns(rounds: int, measure: dict[str, object]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {side: [] for side in measure}
    for r in range(rounds):
        for side in list(measure) if r % 2 == 0 else list(reversed(list(measure))):
            out[side].append(measure[side]())  # type: ignore[operator]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    rounds = parser.parse_args().rounds
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("parse distributed.yaml, ms CPU (best of 9):", {k: round(v, 1) for k, v in parse_ms().items()})
    cpu = turns(9, {s: (lambda s=s: 1000 * run(SUPERVISOR, s, ROOT)) for s in ("nopatch", "patch")})
    print(
        "supervisor's yaml.safe_load, ms CPU (median of 9):",
        {s: round(statistics.median(v), 1) for s, v in cpu.items()},
    )
    with tempfile.TemporaryDirectory() as folder:
        sides = {"nopatch": unpatched_copy(Path(folder)), "patch": ROOT}
        for kind in ("cold", "warm"):
            took = turns(rounds, {s: (lambda p=p, kind=kind: run(START, kind, p)) for s, p in sides.items()})
            print(
                f"{kind} start, s (median of {rounds}):",
                {s: round(statistics.median(v), 3) for s, v in took.items()},
            )


if __name__ == "__main__":
    main()
