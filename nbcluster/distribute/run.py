"""`distribute()` and `wait()`: the API that `%%distribute` parses its line into.

The order of a run, and why:

1. Validate arguments, parse the cell, evaluate `--over/--grid/--zip` in the user's
   namespace, capture the free names (pickling each: a bad one is named here), connect to
   the cluster and check resource restrictions can be met. Any of these failing raises an
   `NbclusterError` with one message, and nothing has been sent or written.
2. Create the `Results` (written to `--into` now, so a `--no-wait` variable exists at
   once), run the first `--local K` items in the kernel, ship large values (once per
   worker, cached) and the cell's context blob.
3. A driver thread (`engine.Engine._drive`) submits the batches, one item each until an
   item time is measured, then growing (`batching.py`), streams each finished batch into
   the `Results` and resubmits failed items while `--retries` allow. It is the only thread that talks to Dask after the start, so
   `--no-wait` is the same code with the kernel's main thread returning at once.
4. With `wait=True`, the main thread follows the `Results` (`follow.py`): it prints item
   output as it arrives, then one summary line and the first traceback if items failed.
   Ctrl-C / the stop button lands there: the engine stops the run (running batches return
   after their current item, with what they finished), the `Results` keep it all, and an
   `Interrupted` exception (a `KeyboardInterrupt`, so "Run all" stops) ends the cell with
   one line instead of a traceback.

Worker loss: Dask re-runs the batches a dead worker held (its nanny restarts it);
`Results` ignores any second delivery for an item, so every item is reported exactly once.
"""

from __future__ import annotations

import builtins
import secrets
import sys
from collections.abc import Callable
from typing import Any

from nbcluster.distribute.capture import Capture, capture, code_index, human
from nbcluster.distribute.cell import Cell
from nbcluster.distribute.engine import Engine, Job
from nbcluster.distribute.follow import Interrupted, follow, interrupted, report
from nbcluster.distribute.options import DistributeOptions
from nbcluster.distribute.plan import Plan, plan
from nbcluster.distribute.results import Results
from nbcluster.errors import BadArgument


def distribute(
    body: str | Callable[..., Any],
    *,
    over: Any = None,
    grid: Any = None,
    zip: Any = None,
    namespace: dict[str, Any] | None = None,
    into: str | None = None,
    gpus: float | None = None,
    cpus: float | None = None,
    cpu_only: bool = False,
    retries: int = 0,
    batch: int | str = "auto",
    wait: bool = True,
    seed: int | None = None,
    everywhere: bool = False,
    local: int | str | bool = 0,
    cluster: str | None = None,
    client: Any = None,
    progress: Callable[[Results], None] | None = None,
    first_line: int = 1,
) -> Results:
    """Run a cell body (source) or a function on the cluster, once per item; see README.

    `body` is cell source (run with the item's names bound, value of its last expression
    kept) or a function (called as `fn(x)` for `over`, `fn(a, b)` for a tuple target,
    `fn(**params)` for `grid`/`zip`, `fn()` otherwise; plus `seed=` with `seed`).
    `over`, `grid`, `zip` are strings evaluated in `namespace` (default: the caller's
    globals and locals), or for functions also an iterable / a dict of lists.
    `first_line` is the notebook line number of the body's first line (2 in a cell magic).
    """
    _check(
        body, into, gpus, cpus, cpu_only, retries, batch, seed, everywhere, local, over, grid, zip, namespace
    )
    frame_globals = None
    if namespace is None:
        caller = sys._getframe(1)
        frame_globals = caller.f_globals
        namespace = {**caller.f_globals, **caller.f_locals}
    run_id = _run_id()
    cell = fn = None
    if isinstance(body, str):
        cell = Cell.parse(body, filename=f"<distribute-{run_id}>", first_line=first_line)
    else:
        fn = body
    job = Job(
        cell=cell, fn=fn, seed=seed, gpus=gpus, cpus=cpus, cpu_only=cpu_only, retries=retries, batch=batch
    )
    engine = Engine(job, run_id, client=client, cluster=cluster)

    if everywhere:
        engine.connect()
        the_plan = Plan("everywhere", list(engine.eligible))
        if not the_plan.items:
            raise BadArgument("--everywhere: the cluster has no workers right now; scale it up first")
    else:
        the_plan = plan(over=over, grid=grid, zip=zip, evaluate=_evaluator(namespace))
    n = len(the_plan)
    n_local = n if local in ("all", True) else min(int(local), n)
    remote = n_local < n
    if cell is not None and fn is None:
        bound = [*the_plan.names, *(["seed"] if seed is not None else [])]
        job.capture = capture(cell.free_names(bound), namespace, pickle_values=remote)
    if remote:
        engine.connect()
        job.check_items(the_plan, n_local)
        job.spec(the_plan, for_workers=True)  # a function that cannot travel fails here
    results = Results(the_plan, run_id=run_id, label=into)
    results.code_index = code_index([*job.capture.direct.values(), *([fn] if fn is not None else [])])
    engine.bind(results, the_plan)
    results._begin([])
    if into is not None:
        (frame_globals if frame_globals is not None else namespace)[into] = results
    if progress is not None:
        results.subscribe(progress)
        progress(results)

    engine.local_only = not remote
    try:
        if (n_local and not engine.run_local(range(n_local))) or not remote:
            # A failure in the kernel stops the fan-out: that is what --local K is for.
            results._cancel_pending()
            results._end()
            report(results)
            return results
        notes = engine.ship()
    except BaseException as e:
        # Interrupted (or failed) before anything was submitted: the results end here.
        results._cancel_pending()
        results._end()
        if isinstance(e, KeyboardInterrupt):
            raise interrupted(results) from None
        raise
    line = _shipped_line(job.capture, notes)
    if line:
        results.shipped = line
        print(line)
    engine.start(list(range(n_local, n)))
    if wait:
        follow(results)
    return results


def wait(target: Results | str, *, namespace: dict[str, Any] | None = None) -> Results:
    """Block until a `--no-wait` run finishes, printing its output and failures here.

    `target` is the `Results` or the name of the variable holding it (`%distribute wait NAME`).
    """
    if isinstance(target, str):
        name = target
        ns = namespace if namespace is not None else sys._getframe(1).f_globals
        if name not in ns:
            raise BadArgument(f"`{name}` is not defined: give the --into name of a --no-wait cell")
        target = ns[name]
        if not isinstance(target, Results):
            raise BadArgument(
                f"`{name}` is a {type(target).__name__}, not the results of a %%distribute cell"
            )
    follow(target)
    return target


def _evaluator(namespace: Any) -> Callable[[str, str], Any]:
    def evaluate(expression: str, flag: str) -> Any:
        try:
            code = compile(expression, f"<--{flag}>", "eval")
        except SyntaxError as e:
            raise BadArgument(f"--{flag}: {expression!r} is not a Python expression ({e.msg})") from None
        # A copy as globals: eval would add __builtins__ to the user's dict, and
        # comprehensions in the expression need the names as globals to see them.
        scope = dict(namespace)
        scope.setdefault("__builtins__", builtins)
        try:
            return eval(code, scope)
        except Exception as e:
            raise BadArgument(
                f"--{flag}: evaluating {expression!r} failed: {type(e).__name__}: {e}"
            ) from None

    return evaluate


def _shipped_line(cap: Capture, notes: list[str]) -> str:
    parts = []
    if cap.values:
        size = sum(len(b) for b in cap.values.values())
        parts.append(f"sent {', '.join(cap.values)} ({human(size)}) with the cell")
    if cap.modules:
        parts.append(f"import {', '.join(sorted(set(cap.modules.values())))} on the workers")
    parts.extend(notes)
    return "nbcluster: " + "; ".join(parts) if parts else ""


def _run_id() -> str:
    rid = secrets.token_hex(6)
    # Dask's key_split drops an all-letters hex word, but a digit keeps key prefixes tidy.
    return rid if any(c.isdigit() for c in rid) else "0" + rid[1:]


def _check(body: Any, into: Any, gpus: Any, cpus: Any, cpu_only: Any, retries: Any, batch: Any, seed: Any,
           everywhere: Any, local: Any, over: Any, grid: Any, zip_: Any, namespace: Any) -> None:  # fmt: skip
    if not isinstance(body, str) and not callable(body):
        raise BadArgument(f"distribute() needs cell source (a str) or a function, got {type(body).__name__}")
    if namespace is not None and not hasattr(namespace, "__getitem__"):
        raise BadArgument("namespace= needs a dict of the notebook's variables")
    DistributeOptions(
        over=over, grid=grid, zip=zip_, into=into, gpus=gpus, cpus=cpus, cpu_only=cpu_only,
        retries=retries, batch=batch, seed=seed, everywhere=everywhere, local=local,
    )  # fmt: skip


__all__ = ["Interrupted", "distribute", "wait"]
