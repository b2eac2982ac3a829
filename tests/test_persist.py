"""`--persist`: results that stay on the workers, chained into later cells, on real clusters.

Most tests share one 2-worker cluster of this module's own (100 MB values must not load the
session's shared cluster); the tests that kill a worker or stop the cluster start their own.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import nbcluster
from nbcluster import _compat, _current
from nbcluster.cluster.handle import ClusterHandle
from nbcluster.errors import BadArgument, HandleGone
from nbcluster.persist.handles import Handle, publish
from nbcluster.run.api import distribute
from nbcluster.run.results import Results
from tests.os_helpers import rss
from tests.shell_helpers import cell, magic
from tests.waiting import until

_tick = threading.Event()  # never set: a wait between polls


@pytest.fixture(scope="module")
def _persist_cluster() -> Iterator[ClusterHandle]:
    handle = nbcluster.start(workers=2, threads=1, name="persist")
    handle.client.wait_for_workers(2)
    yield handle
    _current.forget(handle.name)
    handle.stop()


@pytest.fixture
def pc(shell: InteractiveShell, _persist_cluster: ClusterHandle) -> ClusterHandle:
    """This module's cluster, current for the test's shell (asked for after `shell`)."""
    return _current.use(_persist_cluster)


def _persisted_bytes(client: Any, run_id: str) -> int:
    """What the workers hold in their own stores for the keys of one --persist run."""

    def held(dask_worker: Any, prefix: str) -> int:
        from dask.sizeof import sizeof

        return sum(sizeof(v) for k, v in dask_worker.data.items() if str(k).startswith(prefix))

    return sum(client.run(held, prefix=f"persist-{run_id}-").values())


def _sent_bytes(client: Any) -> int:
    """Bytes the workers have sent (to each other and to the kernel) since they started."""
    return sum(client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total).values())


def test_persisted_values_stay_on_the_workers_and_the_kernel_stays_flat(
    shell: InteractiveShell, pc: ClusterHandle
) -> None:
    cell(shell, "import numpy as np")
    before = rss()
    cell(shell, '%%distribute --over "x in range(4)" --persist --into shards\nnp.full(12_500_000, float(x))')
    grown = rss() - before
    shards = shell.user_ns["shards"]
    assert isinstance(shards, Results) and shards.ok
    assert grown < 20 * 2**20, f"the kernel grew by {grown / 2**20:.1f} MiB while the workers hold 400 MB"
    handles = [shards[i] for i in range(4)]
    assert all(isinstance(h, Handle) for h in handles)
    holders = pc.client.who_has([h.future for h in handles])
    names = {a: str(w["name"]) for a, w in _compat.workers(pc.client).items()}
    for h in handles:
        [address] = holders[h.key]
        assert repr(h) == f"<on worker {names[address]}: ndarray (12500000,) float64, 100.0 MB>"
    assert shards.nbytes == 4 * 100_000_000
    with capture_output() as out:
        cell(shell, "%cluster status")
    [shown] = [o.data["text/plain"] for o in out.outputs if "text/plain" in o.data and "Cluster" in o.data["text/plain"]]
    for address, name in names.items():
        n = sum(holders[h.key] == (address,) for h in handles)
        line = f"  {name:<8} holds persisted shards: {n} ({n * 100}.0 MB)"
        assert (line in shown.splitlines()) == bool(n), shown
    assert _persisted_bytes(pc.client, shards.run_id) == 4 * 100_000_000
    one = shards.gather(2)
    assert one.shape == (12_500_000,) and one[0] == 2.0
    del one
    assert [v[0] for v in shards.gather()] == [0.0, 1.0, 2.0, 3.0]
    shards.release()
    assert until(lambda: _persisted_bytes(pc.client, shards.run_id) == 0)


def test_chained_items_run_where_their_value_is_and_move_nothing(shell: InteractiveShell, pc: ClusterHandle) -> None:
    cell(shell, "import numpy as np\nrates = [0.5, 1.0, 2.0, 4.0]")
    cell(shell, '%%distribute --over "x in range(4)" --persist --into shards\nnp.full(2_500_000, float(x))')
    shards = shell.user_ns["shards"]
    holders = pc.client.who_has([shards[i].future for i in range(4)])
    sent = _sent_bytes(pc.client)
    source = "from distributed import get_worker\n(get_worker().address, float(shard.sum()))"
    cell(shell, f'%%distribute --over "shard in shards" --into sums\n{source}')
    cell(shell, f'%%distribute --zip "shard=shards, lr=rates" --into scaled\n{source[:-1]} * lr)')
    moved = _sent_bytes(pc.client) - sent
    for i, (where, total) in enumerate(shell.user_ns["sums"]):
        assert (where,) == holders[shards[i].key], f"item {i} ran away from its value"
        assert total == i * 2_500_000
    assert [t for _, t in shell.user_ns["scaled"]] == [i * 2_500_000 * r for i, r in enumerate([0.5, 1, 2, 4])]
    # Each shard is 20 MB: had one moved, this would be millions. The results are a few floats.
    assert moved < 100_000, f"{moved} bytes moved between the workers and the kernel"



def test_a_chained_cell_over_every_holder_is_one_graph_message(shell: InteractiveShell, pc: ClusterHandle) -> None:
    # One message per holding worker was 1,000 messages at 1,000 workers (~1.5 ms of the
    # scheduler's time each); the tasks are bound to their holders within one message instead.
    def messages() -> int:
        events = pc.client.get_events("scheduler")
        return sum(1 for _, e in events if isinstance(e, dict) and e.get("action") == "update-graph")

    cell(shell, '%%distribute --over "x in range(8)" --persist --into tiny\nx * 10')
    tiny = shell.user_ns["tiny"]
    holders = pc.client.who_has([tiny[i].future for i in range(8)])
    assert len(set(holders.values())) == 2, "the values should be spread over both workers"
    before = messages()
    cell(shell, '%%distribute --over "t in tiny" --into where\nfrom distributed import get_worker\n(get_worker().address, t)')
    assert messages() - before == 1
    for i, (address, value) in enumerate(shell.user_ns["where"]):
        assert (address,) == holders[tiny[i].key] and value == i * 10, f"item {i} ran away from its value"

def test_a_pipeline_persists_again_and_a_handle_captured_by_name_is_resolved_on_the_workers(
    shell: InteractiveShell, pc: ClusterHandle
) -> None:
    cell(shell, "import numpy as np")
    cell(shell, '%%distribute --over "x in range(2)" --persist --into shards\nnp.full(1_000_000, float(x + 1))')
    cell(shell, '%%distribute --over "shard in shards" --persist --into doubled\nshard * 2')
    doubled = shell.user_ns["doubled"]
    assert all(isinstance(doubled[i], Handle) for i in range(2))
    assert [v[0] for v in doubled.gather()] == [2.0, 4.0]
    cell(shell, "model = doubled[1]")
    with capture_output() as out:
        cell(shell, '%%distribute --over "x in range(4)" --into scored\nfloat(model[0]) + x')
    assert shell.user_ns["scored"].values() == [4.0, 5.0, 6.0, 7.0]
    assert "model" not in out.stdout, out.stdout  # not sent with the cell: a Dask dependency
    # Over a range (kept as one), the run still lets go of the captured handle when it ends.
    assert "failed" not in out.stderr, out.stderr
    assert shell.user_ns["scored"].retry() is not None  # nothing to run again: recalls nothing


def test_del_rebinding_and_release_free_the_workers_within_seconds(shell: InteractiveShell, pc: ClusterHandle) -> None:
    make = '%%distribute --over "x in range(2)" --persist --into {}\nimport numpy as np\nnp.ones(2_500_000)'
    cell(shell, make.format("a"))
    a = shell.user_ns["a"].run_id
    cell(shell, '%%distribute --over "s in a" --into reads\nfloat(s.sum())')  # a finished run reads a
    cell(shell, "b = a[0]")
    assert _persisted_bytes(pc.client, a) == 2 * 20_000_000
    cell(shell, "del a")
    assert until(lambda: _persisted_bytes(pc.client, a) == 20_000_000, 5)  # b still holds item 0
    _tick.wait(0.5)
    assert _persisted_bytes(pc.client, a) == 20_000_000
    cell(shell, "b")  # shown: in Out and `_` now
    cell(shell, "b = None")
    assert until(lambda: _persisted_bytes(pc.client, a) == 0, 5), "del did not free the workers"
    cell(shell, make.format("c"))
    c = shell.user_ns["c"].run_id
    cell(shell, make.format("c"))  # rebinding c
    assert until(lambda: _persisted_bytes(pc.client, c) == 0, 5), "rebinding did not free the workers"


def test_failures_retry_and_everywhere_behave_as_without_persist(
    shell: InteractiveShell, pc: ClusterHandle, tmp_path: Any
) -> None:
    flag = tmp_path / "fixed"
    shell.user_ns["flag"] = str(flag)
    with capture_output() as out:
        cell(
            shell,
            '%%distribute --over "x in range(3)" --persist --into res\n'
            "import os\nif x == 1 and not os.path.exists(flag):\n    raise ValueError('not yet')\n[x] * 3",
        )
    assert "1/3 items failed: ValueError at item 1 (x=1)" in out.stderr  # as without --persist
    res = shell.user_ns["res"]
    assert res.counts()["failed"] == 1 and res.errors[0].type_name == "ValueError"
    flag.write_text("")
    res.retry()
    assert res.ok and res.gather() == [[0] * 3, [1] * 3, [2] * 3]
    assert re.fullmatch(r"<on worker cpu-[01]: list len 3, \d+ B>", repr(res[1]))
    cell(shell, "%%distribute --everywhere --persist --into per\nimport os\n{'pid': os.getpid()}")
    per = shell.user_ns["per"]
    workers = sorted(_compat.workers(pc.client))
    assert len(per) == 2 and sorted(per.params[i]["worker"] for i in range(2)) == workers
    cell(shell, '%%distribute --over "v in per" --into pids\nimport os\n(v["pid"], os.getpid())')
    assert all(mine == theirs for mine, theirs in shell.user_ns["pids"])  # each worker its own value


def test_a_value_released_as_it_is_published_leaves_no_dataset(pc: ClusterHandle) -> None:
    # Both calls are queued at once: the delete must reach the scheduler after the put.
    def published() -> list[str]:
        return [str(n) for n in pc.client.list_datasets() if str(n).startswith("nbcluster-order-")]

    for i in range(5):
        handle = Handle(pc.client.scatter(i), {"type": "int", "shape": None, "nbytes": 28}, i)
        publish(pc.client, [handle], "nbcluster-order")
        handle.release()
    assert until(lambda: not published(), 5), published()
    kept = Handle(pc.client.scatter(9), {"type": "int", "shape": None, "nbytes": 28}, 9)
    publish(pc.client, [kept], "nbcluster-order")
    assert until(lambda: published() == ["nbcluster-order-9"], 5), published()
    kept.release()
    assert until(lambda: not published(), 5), published()


def test_a_retry_of_a_run_whose_input_was_released_since_is_one_line(pc: ClusterHandle, tmp_path: Any) -> None:
    shards = distribute(lambda x: [x], over=range(2), persist=True, into="shards", namespace={}, on=pc)
    ns = {"shards": shards, "flag": str(tmp_path / "ready")}
    source = "import os\nif not os.path.exists(flag):\n    raise ValueError('not yet')\ns[0]"
    reads = distribute(source, over="s in shards", into="reads", namespace=ns, on=pc)
    assert reads.counts()["failed"] == 2
    (tmp_path / "ready").write_text("")
    shards[1].release()
    with pytest.raises(BadArgument, match=r"^a persisted result this run read was deleted or released since: run the "
                                          r"cells that make it again, then this one$"):  # fmt: skip
        reads.retry()
    del ns["shards"], shards  # the run held its input weakly: only the notebook's name kept it
    with pytest.raises(BadArgument, match="deleted or released since"):
        reads.retry()


def test_bad_input_is_one_line_before_anything_runs(shell: InteractiveShell, pc: ClusterHandle) -> None:
    with pytest.raises(UsageError, match=r"^--persist keeps the results on the workers: name them with --into NAME$"):
        cell(shell, '%%distribute --over "x in range(2)" --persist\nx')
    with pytest.raises(UsageError, match=r"^--persist keeps the results on the workers, --local runs"):
        cell(shell, '%%distribute --over "x in range(2)" --persist --local --into r\nx')
    with pytest.raises(BadArgument, match="name them with --into"):
        distribute("x", over=range(2), persist=True, namespace={})
    cell(shell, '%%distribute --over "x in range(2)" --persist --into held\nx')
    with pytest.raises(UsageError, match="persisted results, which stay on the workers: drop --local"):
        cell(shell, '%%distribute --over "s in held" --local --into r\ns')


def test_a_worker_killed_holding_results_recomputes_them(shell: InteractiveShell) -> None:
    magic(shell, "start --workers 2 --threads 1 --name killed")
    client = _current.client_for("killed")
    client.wait_for_workers(2)
    cell(shell, '%%distribute --over "x in range(4)" --batch 1 --persist --into held\nimport numpy as np\nnp.full(1000, x)')
    held = shell.user_ns["held"]
    victim = held[0].future.client.who_has([held[0].future])[held[0].key][0]
    os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
    until(lambda: victim not in _compat.workers(client))
    assert [int(v[0]) for v in held.gather()] == [0, 1, 2, 3]  # Dask's lineage ran the lost items again
    held[1].release()
    held[3].release()
    with pytest.raises(HandleGone) as e:
        held.gather()
    assert str(e.value) == (
        "items 1, 3 of held are lost (released, or its worker died and Dask could not compute it again): "
        "run the cell that made held again; held.gather(i) brings the others"
    )
    assert int(held.gather(2)[0]) == 2


def test_handles_of_a_stopped_or_other_cluster_are_one_line(shell: InteractiveShell) -> None:
    magic(shell, "start --workers 1 --threads 1 --name first")
    cell(shell, '%%distribute --over "x in range(2)" --persist --into held\nx * 10')
    magic(shell, "start --workers 1 --threads 1 --name second")  # now the current cluster
    with pytest.raises(UsageError, match=r"lives on another cluster \(tls://127\.0\.0\.1:\d+\); use --cluster"):
        cell(shell, '%%distribute --over "h in held" --into r\nh')
    assert cell(shell, '%%distribute --over "h in held" --cluster first --into r\nh + 1') is None
    assert shell.user_ns["r"].values() == [1, 11]
    magic(shell, "stop first")
    held = shell.user_ns["held"]
    gone = "the cluster that held it was stopped; run the cell that made it again (on a running cluster)"
    assert repr(held[0]) == f"<gone: {gone}>"
    with pytest.raises(HandleGone) as e:
        held.gather()
    assert str(e.value) == f"item 0's value is gone: {gone}"
    with pytest.raises(UsageError, match=f"^a persisted result read by this cell is gone: {re.escape(gone)}$"):
        cell(shell, '%%distribute --over "h in held" --into r\nh')


def _kill_holder(client: Any, handle: Handle) -> str:
    """SIGKILL the worker holding `handle`'s value; its address, once the scheduler saw it go."""
    victim = str(client.who_has([handle.future])[handle.key][0])
    os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
    assert until(lambda: victim not in _compat.workers(client))
    return victim


def test_a_lost_item_whose_input_is_gone_too_is_named_and_the_others_still_come(
    shell: InteractiveShell, tmp_path: Any
) -> None:
    magic(shell, "start --workers 2 --threads 1 --name unrecoverable")
    client = _current.client_for("unrecoverable")
    client.wait_for_workers(2)
    data = tmp_path / "input.txt"
    data.write_text("70")
    shell.user_ns["path"] = str(data)
    cell(shell, '%%distribute --over "x in range(4)" --batch 1 --persist --into held\nint(open(path).read()) + x')
    held = shell.user_ns["held"]
    holders = client.who_has([held[i].future for i in range(4)])
    data.unlink()  # the cell's input is gone too: Dask's lineage cannot make the lost items again
    victim = _kill_holder(client, held[0])
    lost = [i for i in range(4) if holders[held[i].key] == (victim,)]
    with pytest.raises(HandleGone) as e:
        held.gather()
    items = f"item{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))}"
    assert str(e.value) == (
        f"{items} of held {'are' if len(lost) > 1 else 'is'} lost (released, or its worker died and Dask could "
        "not compute it again): run the cell that made held again; held.gather(i) brings the others"
    )
    assert [held.gather(i) for i in range(4) if i not in lost] == [70 + i for i in range(4) if i not in lost]
    with pytest.raises(HandleGone, match=r"^item \d's value is gone: no worker holds it any more"):
        held.gather(lost[0])
    assert repr(held[lost[0]]).startswith("<gone: no worker holds it any more")


def test_lineage_recomputes_a_chained_value_after_its_input_handles_were_released(shell: InteractiveShell) -> None:
    magic(shell, "start --workers 2 --threads 1 --name lineage")
    client = _current.client_for("lineage")
    client.wait_for_workers(2)
    cell(shell, '%%distribute --over "x in range(4)" --batch 1 --persist --into shards\nimport numpy as np\nnp.full(1000, x)')
    cell(shell, '%%distribute --over "s in shards" --persist --into doubled\ns * 2')
    shards, doubled = shell.user_ns["shards"], shell.user_ns["doubled"]
    shards.release()
    assert until(lambda: _persisted_bytes(client, shards.run_id) == 0)  # the inputs' memory is free
    _kill_holder(client, doubled[0])
    # Dask ran the first cell's lost items again, then the second's: its lineage outlives the handles.
    assert [int(v[0]) for v in doubled.gather()] == [0, 2, 4, 6]


def test_cancel_of_a_persisted_run_keeps_what_finished_and_leaves_nothing_running(pc: ClusterHandle) -> None:
    # Every item of a --persist run goes out at once, a task each: a cancel must still end
    # within the grace, keep the finished values on the workers, and leave no task behind.
    res = distribute("import time\ntime.sleep(0.2)\n[x] * 3", over="x in range(40)", namespace={}, into="held",
                     persist=True, wait=False)  # fmt: skip
    assert until(lambda: res.counts()["done"] >= 2)
    started = time.monotonic()
    res.cancel()
    assert time.monotonic() - started < 4  # the cancel grace (2 s) and a margin
    counts = res.counts()
    assert counts["done"] >= 2 and counts["cancelled"] >= 30 and counts["running"] == 0, counts
    done = [i for i in range(40) if isinstance(res.values()[i], Handle)]
    assert len(done) == counts["done"] and [res.gather(i) for i in done] == [[i] * 3 for i in done]
    prefix = f"persist-{res.run_id}-"

    def states(dask_scheduler: Any) -> dict[str, str]:
        return {str(k): ts.state for k, ts in dask_scheduler.tasks.items() if str(k).startswith(prefix)}

    # The scheduler forgets the cancelled ones; only the finished values stay, one key each.
    assert until(lambda: set(pc.client.run_on_scheduler(states).values()) == {"memory"}, 5), pc.client.run_on_scheduler(states)
    assert len(pc.client.run_on_scheduler(states)) == len(done)
    res.release()
    assert until(lambda: _persisted_bytes(pc.client, res.run_id) == 0)


def test_a_persisted_items_large_output_still_reaches_the_cell(pc: ClusterHandle) -> None:
    # A report larger than push.LARGEST is not pushed as an event: the kernel reads it from the
    # worker that kept it (from its holder for a value; from every worker for an item that
    # raised, whose task holds nothing).
    source = 'print("x" * 20_000)\nif i == 1:\n    raise ValueError("no")\n[i]'
    res = distribute(source, over="i in range(2)", namespace={}, into="held", persist=True)
    assert isinstance(res.values()[0], Handle) and res.gather(0) == [0]
    assert res.output(0) == "x" * 20_000 + "\n" and res.output(1) == "x" * 20_000 + "\n"
    assert res.counts()["failed"] == 1 and res.errors[0].type_name == "ValueError" and res.errors[0].index == 1
