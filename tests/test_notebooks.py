"""The teaching notebooks run top to bottom on a real kernel, as in CI and on Binder, and each
graded cell tells a right answer from a wrong one.

Every `notebooks/*.ipynb` is picked up (a new notebook needs no edit here) and executed with
`NBCLUSTER_SMALL=1`, the size CI can afford, and a per-cell timeout. A notebook passes when
no cell raised, no `%%distribute` cell reported failed items (a failing item does not raise:
the cell ends with a summary line on stderr, which is checked here, except in a cell tagged
``failures-expected``), every cluster it started is stopped, and none of its processes
(kernel, supervisors, workers) is left running.

The same run grades every exercise with nbgrader's own rule (`determine_grade`: a graded cell
that raised or wrote to stderr scores zero): first with each of the deliberately wrong answers
from `WRONG` (every graded cell must give zero to at least two of them, and each of them must
lose points), then with the instructor's answer, which must score full marks, before the notebook goes on. The wrong answers are plausible
mistakes; several pass the visible tests and are caught only by the hidden ones (marked "hidden"
below).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import NamedTuple

import nbformat
import pytest
from nbclient import NotebookClient
from nbgrader.utils import determine_grade

import nbcluster
from tests.docs_helpers import teaching_notebooks

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 240  # seconds; a whole small-mode notebook takes about a minute
FAILED_ITEMS = re.compile(r"\d+/\d+ items failed")
EXPECTED_FAILURES = "failures-expected"  # a cell tag: its failed items are the lesson

# Wrong answers for every exercise (the grade_id of its solution cell), as a student might write
# them: the whole new source of the solution cell. At least two each (`MIN_WRONG`).
MIN_WRONG = 2
WRONG: dict[str, list[str]] = {
    # 01
    "parallel-loop": [
        "%%distribute --into parallel\n[pi_chunk(POINTS, seed) for seed in range(CHUNKS)]",  # one item
        '%%distribute --over "seed in range(CHUNKS)" --into parallel\npi_chunk(POINTS, seed + 1)',  # other seeds
    ],
    "amdahl": [
        "def amdahl(f, p):\n    return f + (1 - f) * p",  # Gustafson's law (hidden)
        "def amdahl(f, p):\n    return 1 / (f / p + (1 - f))",  # the parts swapped
    ],
    "batch-by-hand": [
        '%%distribute --over "group in [range(ITEMS)]" --batch 1 --into by_hand\n'
        "[x * x for x in group]",  # one group: one worker idle (hidden)
        '%%distribute --over "x in range(ITEMS)" --batch 1 --into by_hand\n[x * x]',  # one task per item
    ],
    # 02
    "average": [
        "def average(grads):\n    return [sum(parts) for parts in zip(*grads)]",  # the sum
        "def average(grads):\n    return [parts[0] for parts in zip(*grads)]",  # the first worker's (hidden)
    ],
    "parallel-gradient": [
        "def parallel_gradient(params, batch, seed):\n"
        "    local = shards.gather()  # the shards come to the kernel, and go out again with the items\n"
        "    grads = nbcluster.distribute(lambda shard, seed: gradient(params, shard, batch // len(local), seed),\n"
        "                                 over=local, seed=seed)\n"
        "    return average(list(grads))",  # the right values: only the bytes moved tell
        "def parallel_gradient(params, batch, seed):\n"
        "    grads = nbcluster.distribute(lambda shard, seed: gradient(params, shard, batch, seed), over=shards, seed=seed)\n"
        "    return average(list(grads))",  # the whole batch on every shard (hidden)
    ],
    "step-model": [
        'c, k = np.polyfit(BATCHES, [step_seconds[b, "one worker"] for b in BATCHES], 1)\n'
        "break_even = c / k",  # the coefficients swapped (hidden)
        'k, c = np.polyfit(BATCHES, [step_seconds[b, "one worker"] for b in BATCHES], 1)\n'
        "break_even = k / c",  # the break-even upside down (hidden)
    ],
    "comm-bytes": [
        "def server_bytes(n, W):\n    return 2 * n * W\n\n\n"
        "def ring_bytes(n, W):\n    return 2 * (W - 1) * n",  # whole gradients, not pieces (hidden)
        "def server_bytes(n, W):\n    return n * W\n\n\n"
        "def ring_bytes(n, W):\n    return 2 * (W - 1) * n / W",  # the weights never go back
    ],
    "allreduce-by-hand": [
        "def allreduce_mean(model):\n    for p in model.parameters():\n"
        "        dist.all_reduce(p.grad)",  # the sum, not the mean: twice the step (hidden)
        "def allreduce_mean(model):\n    for p in model.parameters():\n"
        "        dist.broadcast(p.grad, src=0)",  # rank 0's gradient only: the ranks agree (hidden)
        "def allreduce_mean(model):\n    pass",  # each rank its own gradient: the ranks drift apart
    ],
    "light-closure": [
        "def light_norm(x):\n    return float(np.linalg.norm(np.full(10, x))) * big.shape[0]",  # (hidden)
        "ROWS = big.shape[0]\n\n\ndef light_norm(x):\n    return float(np.linalg.norm(np.full(10, x)))",  # wrong values
    ],
    # 03
    "best-third": [
        "def best_third(scores):\n"
        "    return sorted(range(len(scores)), key=lambda i: scores[i])[: max(1, len(scores) // 3)]",  # worst
        "def best_third(scores):\n"
        "    return sorted(range(len(scores)), key=lambda i: -scores[i])[: len(scores) // 3]",  # may be empty
    ],
    "utilisation": [
        "def utilisation(trials, workers):\n"
        '    return sum(t["stop"] - t["start"] for t in trials) / (max(t["stop"] for t in trials) - '
        'min(t["start"] for t in trials))',  # forgets the workers
        "def utilisation(trials, workers):\n"
        '    return sum(t["stop"] - t["start"] for t in trials) / (workers * sum(t["stop"] - t["start"] for t in trials))',
    ],
    "asha": [
        "def asha(n, first_budget, eta=3, seed=2):\n"
        "    rng = np.random.default_rng(seed)\n"
        "    futures = [client.submit(fit_score, **sample(rng), epochs=first_budget, pure=False) for _ in range(n)]\n"
        "    return {first_budget: [(f.result()['score'], None, f.result()) for f in futures]}",  # no promotions
        "def asha(n, first_budget, eta=3, seed=2):\n"  # synchronous halving, repackaged (hidden)
        "    return {b: [(r['score'], s, r) for s, r in zip(c, rs)]\n"
        "            for b, c, rs in successive_halving(n, first_budget, eta, seed)}",
        "def asha(n, first_budget, eta=3, seed=2):\n"  # synchronous halving with as_completed (hidden)
        "    rng = np.random.default_rng(seed)\n"
        "    candidates, budget, rungs = [sample(rng) for _ in range(n)], first_budget, {}\n"
        "    while True:\n"
        "        jobs = {client.submit(fit_on, data, **s, epochs=budget, pure=False): s for s in candidates}\n"
        "        rungs[budget] = [(f.result()['score'], jobs[f], f.result()) for f in as_completed(jobs)]\n"
        "        if len(candidates) == 1 or budget * eta > EPOCHS:\n"
        "            return rungs\n"
        "        candidates = [rungs[budget][i][1] for i in best_third([s for s, _, _ in rungs[budget]])]\n"
        "        budget *= eta",
    ],
    "checkpoint-chaos": [
        "def resilient_trial(lr, alpha):\n"  # no checkpoint: the killed trial starts again from epoch 1 (hidden)
        "    model, scores = new_model(lr, alpha), []\n"
        "    for epoch in range(1, TRIAL_EPOCHS + 1):\n"
        '        train_epoch(model, f"{lr:g}-{alpha:g}", epoch)\n'
        "        scores.append(model.score(X_val, y_val))\n"
        "        nbcluster.report(step=epoch, score=scores[-1])\n"
        "    return scores",
        "def resilient_trial(lr, alpha):\n"  # saves, never loads: the same restart from 1 (hidden)
        "    ck = nbcluster.checkpoint()\n"
        "    state = {'epoch': 0, 'model': new_model(lr, alpha), 'scores': []}\n"
        "    for epoch in range(state['epoch'] + 1, TRIAL_EPOCHS + 1):\n"
        "        train_epoch(state['model'], f\"{lr:g}-{alpha:g}\", epoch)\n"
        "        state['scores'].append(state['model'].score(X_val, y_val))\n"
        "        state['epoch'] = epoch\n"
        "        ck.save(state)\n"
        "        nbcluster.report(step=epoch, score=state['scores'][-1])\n"
        "    return state['scores']",
        "def resilient_trial(lr, alpha):\n"  # the scores are not in the checkpoint: the curve comes back short
        "    ck = nbcluster.checkpoint()\n"
        "    state, scores = ck.load() or {'epoch': 0, 'model': new_model(lr, alpha)}, []\n"
        "    for epoch in range(state['epoch'] + 1, TRIAL_EPOCHS + 1):\n"
        "        train_epoch(state['model'], f\"{lr:g}-{alpha:g}\", epoch)\n"
        "        scores.append(state['model'].score(X_val, y_val))\n"
        "        state['epoch'] = epoch\n"
        "        ck.save(state)\n"
        "        nbcluster.report(step=epoch, score=scores[-1])\n"
        "    return scores",
    ],
    # 04
    "env-per-worker": [
        "def probe(weights, seed):\n"
        "    return try_direction(weights, seed, make_env())  # a build per item\n\n\n"
        "def builds_on_workers():\n"
        "    return sum(nbcluster.everywhere(builds_here))",
        "def probe(weights, seed):\n"
        "    return try_direction(weights, seed, nbcluster.worker_local('env', make_env()))  # not a factory\n\n\n"
        "def builds_on_workers():\n"
        "    return sum(nbcluster.everywhere(builds_here))",
        "ENV = make_env()  # built in the kernel: a copy travels with every item\n\n\n"
        "def probe(weights, seed):\n"
        "    return try_direction(weights, seed, ENV)\n\n\n"
        "def builds_on_workers():\n"
        "    return sum(nbcluster.everywhere(builds_here))",  # (hidden)
        "def probe(weights, seed):\n"
        "    return try_direction(weights, seed, nbcluster.worker_local('env', make_env))\n\n\n"
        "def builds_on_workers():\n"
        "    return builds_here()  # the kernel's count",  # (hidden)
    ],
    "ars-update": [
        "def ars_update(theta, plus, minus, deltas, step, top):\n"
        "    plus, minus, deltas = np.asarray(plus), np.asarray(minus), np.asarray(deltas)\n"
        "    sigma = np.concatenate([plus, minus]).std() + 1e-8\n"
        "    return theta + step / (top * sigma) * ((plus - minus)[:, None] * deltas).sum(axis=0)",  # keeps all
        "def ars_update(theta, plus, minus, deltas, step, top):\n"
        "    plus, minus, deltas = np.asarray(plus), np.asarray(minus), np.asarray(deltas)\n"
        "    kept = np.argsort(-np.maximum(plus, minus))[:top]\n"
        "    return theta + step / top * ((plus[kept] - minus[kept])[:, None] * deltas[kept]).sum(axis=0)",  # no sigma
    ],
    "probe-all": [
        "def probe_all(theta, seed):\n"
        "    weights = tuple(map(float, theta))\n"
        "    results = [try_direction(weights, seed + i) for i in range(DIRECTIONS)]  # in the kernel\n"
        "    return tuple(np.array(column) for column in zip(*results))",  # (hidden)
        "def probe_all(theta, seed):\n"
        "    weights = tuple(map(float, theta))\n"
        "    results = nbcluster.distribute(lambda probe: try_direction(weights, seed), over=range(DIRECTIONS))\n"
        "    return tuple(np.array(column) for column in zip(*results))",  # one seed for all
        "def probe_all(theta, seed):\n"
        "    results = nbcluster.distribute(lambda probe, seed: try_direction(theta, seed), over=range(DIRECTIONS),\n"
        "                                   seed=seed + 1)\n"
        "    return tuple(np.array(column) for column in zip(*results))",  # another seed (hidden)
    ],
    "evaluation": [
        '%%distribute --over "episode in range(20)" --seed 2024 --into evaluation\n'
        "rollout(one_episode(), theta, seed)[0]",  # a numpy float, not an int
        '%%distribute --over "episode in range(20)" --seed 7 --into evaluation\n'
        "int(rollout(one_episode(), theta, seed)[0])",  # another seed (hidden)
    ],
    # 05
    "logistic-step": [
        "def logistic_step(xp, X, y, w, lr):\n"
        "    p = 1.0 / (1.0 + np.exp(-(X @ w)))\n    return w - lr * (X.T @ (p - y)) / len(y)",
        "def logistic_step(xp, X, y, w, lr):\n"
        "    p = 1.0 / (1.0 + xp.exp(-(X @ w)))\n    return w + lr * (X.T @ (p - y)) / len(y)",  # ascent
    ],
    "gpu-cell": [
        "%%distribute --cpu-only --into update\nfit(states, labels, w)",
        "%%distribute --into update\nfit(states, labels, w)",  # no --gpus: placement by chance (hidden)
    ],
    "break-even": [
        "def gpu_break_even(L, c, g, b, B):\n"
        '    return L / (c - g) if c > g else float("inf")',  # forgets the bus (hidden)
        "def gpu_break_even(L, c, g, b, B):\n"
        '    return L / (c - g - b * B) if c - g - b * B > 0 else float("inf")',  # bytes times bandwidth
    ],
    # 06
    "everywhere": [
        "%%distribute --into worker_pids\nimport os\nos.getpid()",
        '%%distribute --over "w in range(2)" --into worker_pids\nimport os\nos.getpid()',  # not every worker (hidden)
    ],
    "pbs-profile": [
        'pbs = {"backend": "jobqueue.pbs", "description": "PBS",\n'
        '       "options": {"queue": "workq", "cores": 2, "memory": "4GiB"}}',
        'pbs = {"backend": "pbs", "description": "PBS",\n'
        '       "options": {"queue": "workq", "cores": 2, "memory": "4GB"}}',  # GB, not GiB (hidden)
    ],
    # 07
    "kill-worker": [
        "def kill_worker(address):\n    return client.run(os.getpid)[address]",  # forgets to kill
        "def kill_worker(address):\n    os.kill(client.run(os.getpid)[address], signal.SIGKILL)\n"
        "    return address",  # the address, not the process id
    ],
    "retries": [
        '%%distribute --over "i in range(N)" --into fetched\nfetch(i)',
        '%%distribute --over "i in range(N)" --into fetched\ntry:\n    r = fetch(i)\nexcept Exception:\n'
        "    r = {'value': 10 * i}\nr",  # swallows the error: the record was not fetched (hidden)
    ],
    "retry-failed": [
        "prepare()\nloaded = nbcluster.distribute(load, over=range(N))\n"
        "for error in loaded.errors:\n    write_input(error.index)\n"
        "loaded = nbcluster.distribute(load, over=range(N))  # a new run: all items again (hidden)",
        "prepare()\nloaded = nbcluster.distribute(load, over=range(N))\nloaded.retry()",  # nothing fixed
    ],
    "lineage": [
        "def resilient_shard(i, worker):\n    return client.scatter(make_shard(i), workers=[worker])",
        "def resilient_shard(i, worker):\n    return client.submit(make_shard, i, workers=[worker], pure=False)",  # pinned (hidden)
    ],
    "resume": [
        "sweep = nbcluster.distribute(sweep_item, over=range(M), batch=1)",  # afresh (hidden)
        # a wrapper is other code: no journal of it to resume (hidden)
        "sweep = nbcluster.distribute(lambda i: sweep_item(i), over=range(M), batch=1, resume=True)",
    ],
    # 08
    "laws": [
        "def amdahl(f, p):\n    return 1.0 / (f + (1.0 - f) / p)\n\n\n"
        "def gustafson(s, p):\n    return 1.0 / (s + (1.0 - s) / p)",  # Amdahl twice (hidden)
        "def amdahl(f, p):\n    return f + (1.0 - f) * p\n\n\n"
        "def gustafson(s, p):\n    return s + (1.0 - s) * p",  # Gustafson twice (hidden)
    ],
    "alpha-beta": [
        "def fit_alpha_beta(sizes, seconds):\n"
        "    return tuple(np.polyfit(np.asarray(sizes, float), np.asarray(seconds, float), 1))",  # swapped
        "def fit_alpha_beta(sizes, seconds):\n"
        "    beta, alpha = np.polyfit(np.asarray(sizes, float), np.asarray(seconds, float), 1)\n"
        "    return alpha, beta",  # unweighted: the largest sends set the line (hidden)
    ],
    "ring-allreduce": [
        "def ring_allreduce(grads):\n"  # a parameter server on worker 0: whole gradients travel
        "    total = client.submit(lambda *g: np.sum(g, axis=0), *grads, workers=[workers[0]], pure=False)\n"
        "    return [client.submit(np.copy, total, workers=[w], pure=False) for w in workers]",
        "def ring_allreduce(grads):\n"  # through the kernel: nothing between workers (hidden)
        "    total = np.sum(client.gather(grads), axis=0)\n"
        "    return [client.scatter(total, workers=[w]) for w in workers]",
    ],
    "makespans": [
        "def static_makespan(durations, workers):\n"
        "    return max(sum(b) for b in np.array_split(np.asarray(durations, float), workers))\n\n\n"
        "def greedy_makespan(durations, workers):\n    return sum(durations) / workers",
        "def static_makespan(durations, workers):\n"
        "    return max(sum(durations[i::workers]) for i in range(workers))\n\n\n"  # round robin (hidden)
        "def greedy_makespan(durations, workers):\n"
        "    free_at = [0.0] * workers\n    for d in durations:\n        heapq.heappush(free_at, heapq.heappop(free_at) + d)\n"
        "    return max(free_at)",
    ],
    "dynamic": [
        '%%distribute --over "block in blocks" --batch 1 --into dynamic\nplay_block(block)',
        '%%distribute --over "d in DURATIONS" --batch 24 --into dynamic\nepisode(d)',  # two static blocks (hidden)
    ],
    "backups": [
        "def with_backups(durations):\n"  # no backups: the straggler's item is waited for
        "    return client.gather(client.map(straggling_episode, durations, pure=False))",
        "def with_backups(durations):\n"  # two copies of everything, from the start (hidden)
        "    firsts = [client.submit(straggling_episode, d, pure=False) for d in durations]\n"
        "    seconds = [client.submit(straggling_episode, d, pure=False) for d in durations]\n"
        "    out = []\n"
        "    for a, b in zip(firsts, seconds):\n"
        "        done = next(as_completed([a, b]))\n"
        "        out.append(done.result())\n"
        "    return out",
    ],
    # 09
    "capstone-train": [
        "def train(iterations, seed=1000):\n"
        "    reset_attempts()\n"
        "    theta, log = np.zeros(4), []\n"
        "    for k in range(iterations):\n"
        "        chaos(k)\n"
        "        start = time.perf_counter()\n"
        "        current = theta\n"
        "        results = nbcluster.distribute(lambda probe, seed: flaky_probe(current, seed), "
        "over=range(DIRECTIONS), seed=seed + k)\n"  # no retries
        "        plus, minus, deltas = (np.array(column) for column in zip(*results))\n"
        "        theta = ars_update(theta, plus, minus, deltas, step=0.02, top=DIRECTIONS // 2)\n"
        "        log.append({'iteration': k, 'probes': len(results), 'mean_reward': 0.0, 'seconds': 1.0})\n"
        "    return theta, log",
        "def train(iterations, seed=1000):\n"
        "    reset_attempts()\n"
        "    theta, log = np.zeros(4), []\n"
        "    for k in range(iterations):\n"
        "        start = time.perf_counter()\n"  # never calls chaos(): the faults are not faced (log)
        "        current = theta\n"
        "        results = nbcluster.distribute(lambda probe, seed: flaky_probe(current, seed), "
        "over=range(DIRECTIONS), seed=seed + k, retries=2)\n"
        "        plus, minus, deltas = (np.array(column) for column in zip(*results))\n"
        "        theta = ars_update(theta, plus, minus, deltas, step=0.02, top=DIRECTIONS // 2)\n"
        "        log.append({'iteration': k, 'probes': len(results), 'mean_reward': float(plus.mean()),\n"
        "                    'seconds': time.perf_counter() - start})\n"
        "    return theta, log",
        "def train(iterations, seed=1000):\n"
        "    reset_attempts()\n"
        "    theta, log = np.zeros(4), []\n"
        "    for k in range(iterations):\n"
        "        chaos(k)\n"
        "        start = time.perf_counter()\n"
        "        current = theta\n"
        "        results = nbcluster.distribute(lambda probe, seed: flaky_probe(current, seed), "
        "over=range(DIRECTIONS), seed=seed + k, retries=2)\n"
        "        plus, minus, deltas = (np.array(column) for column in zip(*results))\n"
        "        ars_update(theta, plus, minus, deltas, step=0.02, top=DIRECTIONS // 2)  # not kept (policy)\n"
        "        log.append({'iteration': k, 'probes': len(results), 'mean_reward': float(plus.mean()),\n"
        "                    'seconds': time.perf_counter() - start})\n"
        "    return theta, log",
    ],
    "capstone-accounting": [
        'accounting = {"reported": sum(e["probes"] for e in log), "ran": sum(attempts().values())}\n'
        'accounting["repeated"] = 0  # exactly once, it assumes (hidden)',
        'accounting = {"reported": sum(e["probes"] for e in log), "ran": len(attempts())}\n'  # distinct seeds
        'accounting["repeated"] = accounting["ran"] - accounting["reported"]  # (hidden)',
    ],
}


def _grading(cell: nbformat.NotebookNode) -> dict:
    return cell.metadata.get("nbgrader", {})


def _graded_cells(nb: nbformat.NotebookNode, index: int) -> list[int]:
    """The graded code cells after solution cell `index`, up to the next solution cell."""
    found = []
    for i in range(index + 1, len(nb.cells)):
        grading = _grading(nb.cells[i])
        if nb.cells[i].cell_type != "code":
            continue
        if grading.get("solution"):
            break
        if grading.get("grade"):
            found.append(i)
    assert found, f"solution cell {index} has no graded cell after it"
    return found


def _try_wrong(
    client: NotebookClient, nb: nbformat.NotebookNode, first: int, graded: list[int], wrong: str
) -> list[float]:
    """Run the cells from `first` to the last of `graded` with the wrong answer in cell `first`;
    nbgrader's scores of the graded cells.

    The copies run at the end of the notebook (nbclient files a cell's outputs, live-widget
    updates included, by its index) and are removed afterwards, with the display ids they made.
    """
    trial = [copy.deepcopy(c) for c in nb.cells[first : graded[-1] + 1]]
    trial[0].source = wrong
    start = len(nb.cells)
    nb.cells.extend(trial)
    try:
        for offset, cell in enumerate(trial):
            client.execute_cell(cell, start + offset)
    finally:
        del nb.cells[start:]
        for places in client._display_id_map.values():
            for i in range(start, start + len(trial)):
                places.pop(i, None)
    return [determine_grade(trial[i - first])[0] for i in graded]


class Grade(NamedTuple):
    """One graded cell's scores by nbgrader's rule, with each wrong answer and as written."""

    exercise: str  # the grade_id of the solution cell it grades
    wrong: list[float | None]
    right: float | None
    points: float


def execute(
    path: Path, cwd: Path | None = None, grades: dict[str, Grade] | None = None
) -> nbformat.NotebookNode:
    """Run a notebook top to bottom in a fresh kernel; a cell that raises does not stop it.

    With `grades` (a dict to fill, by graded cell's grade_id), every exercise in `WRONG` is first
    run with its wrong answer and the cells up to its last graded cell, then as written.
    """
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(cwd or path.parent)}},
    )
    client.reset_execution_trackers()
    wrong_scores: dict[int, tuple[str, list[float | None]]] = {}
    with client.setup_kernel():
        assert client.kc is not None
        client.wait_for_reply(client.kc.kernel_info())
        for index, cell in enumerate(nb.cells):
            exercise = _grading(cell).get("grade_id")
            if (
                grades is not None
                and cell.cell_type == "code"
                and _grading(cell).get("solution")
                and exercise in WRONG
            ):
                graded = _graded_cells(nb, index)
                wrong_scores.update({i: (exercise, []) for i in graded})
                for wrong in WRONG[exercise]:
                    scores = _try_wrong(client, nb, index, graded, wrong)
                    for i, score in zip(graded, scores, strict=True):
                        wrong_scores[i][1].append(score)
            client.execute_cell(cell, index)
            if grades is not None and index in wrong_scores:
                score, points = determine_grade(cell)
                grades[_grading(cell)["grade_id"]] = Grade(*wrong_scores[index], score, points)
    return nb


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """Error outputs, and failed-item summaries that a %%distribute cell wrote to stderr."""
    found = []
    for index, cell in enumerate(nb.cells):
        expected = EXPECTED_FAILURES in cell.metadata.get("tags", [])
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.output_type == "error":
                found.append(f"cell {index}: {out.ename}: {out.evalue}")
            elif (
                out.output_type == "stream"
                and out.name == "stderr"
                and FAILED_ITEMS.search(out.text)
                and not expected
            ):
                found.append(f"cell {index}: {out.text.strip()}")
    return found


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_tells_right_from_wrong(
    path: Path, no_leftovers: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBCLUSTER_SMALL", "1")
    grades: dict[str, Grade] = {}
    nb = execute(path, grades=grades)
    assert problems(nb) == []
    # Each notebook cleans up after itself: it stops what it started.
    assert nbcluster.clusters() == []
    exercises = {
        _grading(c)["grade_id"] for c in nb.cells if c.cell_type == "code" and _grading(c).get("solution")
    }
    graded = {g.exercise for g in grades.values()}
    assert graded == exercises, f"exercises without a wrong answer in WRONG: {exercises - graded}"
    for grade_id, grade in grades.items():
        assert grade.right == grade.points > 0, f"{grade_id}: the instructor's answer scored {grade}"
        caught = grade.wrong.count(0)
        assert caught >= MIN_WRONG, (
            f"{grade_id}: only {caught} wrong answers to {grade.exercise} scored 0: {grade}"
        )
    # A wrong answer to an exercise with several graded cells (09's train: its log and its
    # policy) may pass one of them, but must lose points somewhere.
    for exercise in exercises:
        cells = [g for g in grades.values() if g.exercise == exercise]
        for n in range(len(WRONG[exercise])):
            scored = sum(g.wrong[n] or 0 for g in cells)
            assert scored < sum(g.points for g in cells), f"wrong answer {n} to {exercise} scored full marks"
    # The docs render this run (docs/_ext/teaching_notebooks.py): a docs build after the tests
    # finds it in its execution cache and executes nothing.
    teaching_notebooks().store(path, nb)


def test_a_failing_item_fails_the_notebook(tmp_path: Path, no_leftovers: Path) -> None:
    """A failing item does not raise in the cell, so the check must read the outputs."""
    nb = nbformat.v4.new_notebook()
    # In this process (--local) and on a real cluster with its live widget, as the notebooks run.
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext nbcluster"),
        nbformat.v4.new_code_cell('%%distribute --local --over "x in [1, 0, 2]" --into r\n1 / x'),
        nbformat.v4.new_code_cell("%cluster start --workers 1"),
        nbformat.v4.new_code_cell('%%distribute --over "x in [0, 1, 0, 3]" --into s\n1 / x'),
        nbformat.v4.new_code_cell('%%distribute --over "x in [0, 1]" --into t\n1 / x'),
        nbformat.v4.new_code_cell("%cluster stop"),
    ]
    nb.cells[4].metadata["tags"] = [EXPECTED_FAILURES]  # a lesson about failures: not a problem
    path = tmp_path / "failing.ipynb"
    nbformat.write(nb, path)
    found = problems(execute(path))
    assert len(found) == 2, found
    assert found[0].startswith("cell 1: 1/3 items failed: ZeroDivisionError"), found
    assert found[1].startswith("cell 3: 2/4 items failed: ZeroDivisionError"), found
