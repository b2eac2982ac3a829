"""GPU check, for a machine with real GPUs: one prepared script, under 5 minutes.

    python bench/gpu_check.py            # on the GPU machine; appends to bench/RESULTS.md
    python bench/gpu_check.py --simulate # smoke test of this script on a CPU machine

1. `%cluster start --gpu-workers auto`; checks one GPU worker per GPU, each pinned to a distinct
   device (CUDA_VISIBLE_DEVICES) and advertising the GPU resource.
2. A `%%distribute --gpus 1` cell runs a large bf16 matrix product on each GPU worker
   (PyTorch, else CuPy; numpy on the CPU under --simulate) and reports TFLOP/s per GPU.
3. Meanwhile the cluster's metrics stream (`handle.metrics`) is sampled: the check passes
   only if GPU utilisation and GPU memory were non-zero during the run.
4. `%%distribute --ranks N --gpus 1` (N = the GPU workers, with PyTorch): an NCCL all-reduce
   across the ranks, one GPU each; passes when every rank holds 1 + 2 + ... + N. Under
   --simulate the placement runs and NCCL is left out (no device behind the GPUs).
5. GPU trials: `%%distribute --gpus 0.25`, four trials per GPU worker, each busy on its GPU for
   a few seconds: passes when four ran at once on every GPU worker, each seeing its worker's
   one device. With 2 GPUs or more, a cluster of `--gpus-per-worker 2`: a `--gpus 2` trial
   sees both (CUDA_VISIBLE_DEVICES and torch's device count), and `--gpus 1` is refused.
The report is printed and appended to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import threading
from pathlib import Path

CELL = """
import os, time
n = size
try:
    import torch
    if not torch.cuda.is_available():  # a CPU build of torch (the --simulate smoke test)
        raise ImportError("no CUDA device")
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    sync, lib, device = torch.cuda.synchronize, "torch", torch.cuda.get_device_name()
except ImportError:
    try:
        import cupy
        a = cupy.random.random((n, n), dtype=cupy.float32)
        b = cupy.random.random((n, n), dtype=cupy.float32)
        sync, lib = cupy.cuda.Device().synchronize, "cupy"
        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except ImportError:
        import numpy
        a = numpy.random.random((n, n)).astype(numpy.float32)
        b = numpy.random.random((n, n)).astype(numpy.float32)
        sync, lib, device = (lambda: None), "numpy (CPU)", "cpu"
for _ in range(3):
    a @ b
sync()
t0 = time.perf_counter()
deadline = t0 + seconds
reps = 0
while time.perf_counter() < deadline:
    c = a @ b
    reps += 1
sync()
elapsed = time.perf_counter() - t0
{"tflops": 2 * n**3 * reps / elapsed / 1e12, "lib": lib, "device": device,
 "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "reps": reps}
"""


RANKS_CELL = """
import os, torch, torch.distributed as dist
nccl = not simulate
if nccl:  # torchrun's idiom: cuda:LOCAL_RANK is this rank's own GPU
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl" if nccl else "gloo")
t = torch.ones(1, device="cuda" if nccl else "cpu") * (dist.get_rank() + 1)
dist.all_reduce(t)
own = torch.cuda.get_device_properties(torch.cuda.current_device()).uuid if nccl else None
(dist.get_rank(), float(t.item()), f"{os.environ.get('CUDA_VISIBLE_DEVICES')} LOCAL_RANK={os.environ['LOCAL_RANK']} uuid={own}", dist.get_backend())
"""


def check_ranks(ip, n: int, simulate: bool, lines: list[str]) -> bool:
    """Step 4: an all-reduce across `n` ranks, one GPU worker each (NCCL on real GPUs)."""
    try:
        import torch  # noqa: F401 - the ranks need it; so does the kernel's check that it is there
    except ImportError:
        lines.append("- --ranks with NCCL: skipped, PyTorch is not installed here")
        return True
    ip.user_ns.update(simulate=simulate)
    runs = ip.run_cell_magic("distribute", f"--ranks {n} --gpus 1", RANKS_CELL)
    want = n * (n + 1) / 2
    ok = bool(runs.ok) and all(v[1] == want for v in runs.values())
    said = "; ".join(f"rank {r}: {total:g} on CUDA_VISIBLE_DEVICES={dev} ({backend})" for r, total, dev, backend in runs.values()) if runs.ok else runs.summary()
    lines.append(f"- --ranks {n} --gpus 1, all-reduce of 1..{n} (want {want:g}): {said} -> {'ok' if ok else 'FAILED'}")
    return ok


TRIAL_CELL = """
import os, time
from distributed import get_worker
began = time.time()
try:
    import torch
    if not torch.cuda.is_available():
        raise ImportError("no CUDA device")
    a = torch.randn(2048, 2048, device="cuda")
    while time.time() < began + hold:
        a @ a
    torch.cuda.synchronize()
    devices = torch.cuda.device_count()
except ImportError:  # the --simulate smoke test: the trial holds its thread as long instead
    time.sleep(hold)
    devices = None
(get_worker().name, os.environ.get("CUDA_VISIBLE_DEVICES"), devices, began, time.time())
"""


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at any instant."""
    edges = sorted([(t0, 1) for t0, _ in spans] + [(t1, -1) for _, t1 in spans])
    now = best = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def check_trials(ip, gpu_workers: list[dict], simulate: bool, lines: list[str]) -> bool:
    """Step 5a: `--gpus 0.25` packs four trials on each GPU worker."""
    ip.user_ns.update(hold=3.0)
    runs = ip.run_cell_magic("distribute", f'--over "i in range({4 * len(gpu_workers)})" --gpus 0.25 --batch 1', TRIAL_CELL)
    if not runs.ok:
        lines.append(f"- --gpus 0.25 trials: {runs.summary()} -> FAILED")
        return False
    ok = True
    for w in gpu_workers:
        mine = [r for r in runs.values() if r[0] == w["name"]]
        together = most_at_once([(r[3], r[4]) for r in mine])
        seen = {(r[1], r[2]) for r in mine}
        good = together == 4 and {v for v, _ in seen} == {w["visible"]} and (simulate or {d for _, d in seen} == {1})
        ok &= good
        lines.append(f"- --gpus 0.25 on {w['name']}: {len(mine)} trials, {together} at once (want 4), CUDA_VISIBLE_DEVICES/torch devices {sorted(seen, key=str)} -> {'ok' if good else 'FAILED'}")
    return ok


def check_two_gpu_workers(ip, simulate: bool, lines: list[str]) -> bool:
    """Step 5b: a worker of two GPUs gives a `--gpus 2` trial both, and refuses `--gpus 1`."""
    import nbcluster
    from nbcluster.errors import BadArgument

    ip.run_line_magic("cluster", "start --gpu-workers 1 --gpus-per-worker 2 --workers 1 --name gpucheck2")
    try:
        ip.user_ns.update(hold=1.0)
        runs = ip.run_cell_magic("distribute", '--over "i in range(2)" --gpus 2', TRIAL_CELL)
        seen = {(r[1], r[2]) for r in runs.values()} if runs.ok else set()
        good = bool(seen) and all(v and len(v.split(",")) == 2 and (simulate or d == 2) for v, d in seen)
        try:
            nbcluster.distribute(lambda x: x, over=[1], needs=nbcluster.Needs(gpus=1))
            refused = "not refused"
        except BadArgument as e:
            refused = str(e)
        good &= refused.startswith("--gpus 1: ")
        lines.append(f"- --gpus-per-worker 2, --gpus 2 trials: CUDA_VISIBLE_DEVICES/torch devices {sorted(seen, key=str)}; --gpus 1: {refused!r} -> {'ok' if good else 'FAILED'}")
        return good
    finally:
        ip.run_line_magic("cluster", "stop gpucheck2")


def sample_gpu_metrics(handle, stop: threading.Event, seen: dict) -> None:
    cursor = None
    while not stop.wait(0.5):
        snap = handle.metrics(since=cursor)
        cursor = snap.get("cursor")
        for s in snap.get("resources", []):
            if "gpu_util" in s:
                seen["util"] = max(seen.get("util", 0.0), float(s["gpu_util"] or 0))
                seen["memory"] = max(seen.get("memory", 0), int(s.get("gpu_memory") or 0))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--simulate", action="store_true", help="CPU smoke test with 2 simulated GPUs")
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    if args.simulate:
        os.environ["NBCLUSTER_SIMULATE_GPUS"] = "2"
        args.size, args.seconds = min(args.size, 512), min(args.seconds, 1.0)
    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-gpucheck-"))

    from IPython.core.interactiveshell import InteractiveShell

    import nbcluster
    from nbcluster.cluster import gpu

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbcluster")
    ip.run_line_magic("cluster", "start --gpu-workers auto --workers 1 --name gpucheck")
    handle = nbcluster.current()
    lines = [f"### GPU check, {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.node()}",
             f"Command: `python bench/gpu_check.py{' --simulate' if args.simulate else ''}`", ""]  # fmt: skip
    ok = True
    try:
        info = handle.info()
        gpu_workers = [w for w in info.workers if w["kind"] == "gpu"]
        visible = handle.client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        pinned = {w["name"]: visible.get(w["address"]) for w in gpu_workers}
        distinct = len(set(pinned.values())) == len(pinned) and None not in pinned.values()
        ok &= bool(gpu_workers) and distinct
        lines.append(f"- GPU workers: {len(gpu_workers)} ({', '.join(f'{k}: CUDA_VISIBLE_DEVICES={v}' for k, v in pinned.items())}); distinct devices: {distinct}")
        for w in gpu_workers:
            lines.append(f"  - {w['name']}: {w['gpu']['name']} ({w['gpu'].get('memory_total')} bytes){' [simulated]' if w['gpu'].get('simulated') else ''}")

        ip.user_ns.update(size=args.size, seconds=args.seconds)
        stop, seen = threading.Event(), {}
        sampler = threading.Thread(target=sample_gpu_metrics, args=(handle, stop, seen), daemon=True)
        sampler.start()
        results = ip.run_cell_magic("distribute", f'--over "i in range({len(gpu_workers)})" --gpus 1', CELL)
        stop.set()
        sampler.join()
        ok &= results.ok
        for r in results:
            lines.append(f"- {r['device']} (CUDA_VISIBLE_DEVICES={r['visible']}, {r['lib']}): {r['tflops']:.3g} TFLOP/s, {r['reps']} products of {args.size}x{args.size}")
        metrics_ok = seen.get("util", 0) > 0 and seen.get("memory", 0) > 0
        ok &= metrics_ok or args.simulate
        lines.append(f"- GPU metrics during the run: max utilisation {seen.get('util', 'absent')}%, max memory {seen.get('memory', 'absent')} bytes -> {'non-zero' if metrics_ok else 'NOT seen'}")
        ok &= check_ranks(ip, len(gpu_workers), args.simulate, lines)
        ok &= check_trials(ip, [{**w, "visible": pinned[w["name"]]} for w in gpu_workers], args.simulate, lines)
    finally:
        ip.run_line_magic("cluster", "stop gpucheck")
    if len(gpu.discover()) >= 2:
        ok &= check_two_gpu_workers(ip, args.simulate, lines)
    else:
        lines.append("- --gpus-per-worker 2: skipped, this machine has fewer than 2 GPUs")
    lines.append(f"- Result: {'PASS' if ok else 'FAIL'}{' (simulated GPUs: no real device, metrics not expected)' if args.simulate else ''}")
    report = "\n".join(lines) + "\n"
    print(report)
    if not args.simulate:
        results_md = Path(__file__).with_name("RESULTS.md")
        with results_md.open("a") as f:
            f.write("\n" + report)
        print(json.dumps({"appended_to": str(results_md)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
