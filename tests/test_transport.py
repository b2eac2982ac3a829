"""The transport on the shared real cluster: batches out as Dask tasks or direct calls, back in one queue.

Tasks wait on a `distributed.Event` the test sets, so what is still out is decided by the
test, not by timing.
"""

from __future__ import annotations

import operator
import uuid
from typing import Any

from distributed import Event

from nbcluster.run.transport import Link, Needs, Transport


def _wait_then(name: str, x: int) -> int:
    from distributed import Event

    Event(name).wait(60)
    return x + 1


def _opened(transport: Transport, client: Any) -> bool:
    """`transport.open` for Dask tasks only, on the shared cluster's client."""
    return transport.open(Link(Needs(), client=client, find=lambda name: None).open(), direct=False)


def _all_back(transport: Transport, client: Any) -> dict[Any, tuple[Any, Any]]:
    """Every batch's (items, result), as the driver would take them."""
    back = {}
    for done in transport.completions():
        for future, result in zip(done, transport.results(client, done), strict=True):
            batch, _, unrun = transport.take(future)
            assert not unrun
            back[future] = (batch, result)
    return back


def test_tasks_go_out_in_one_map_keyed_by_the_run_and_come_back_with_their_items(cluster: Any) -> None:
    client = cluster.client
    run_id = uuid.uuid4().hex[:8]
    transport = Transport(run_id)
    assert _opened(transport, client) is False  # no direct workers asked for
    calls = [(operator.add, 1, 2), (operator.add, 3, 4)]
    made = transport.map(client, calls, [range(0, 1), range(1, 3)])
    assert [str(f.key) for f in made] == [f"distribute-{run_id}-0", f"distribute-{run_id}-1"]
    assert len(transport.pending) == 2
    back = _all_back(transport, client)
    transport.close()
    assert {tuple(batch): result for batch, result in back.values()} == {(0,): 3, (1, 2): 7}
    assert not transport.pending


def test_a_batch_sent_while_none_is_out_ran_alone(cluster: Any) -> None:
    client = cluster.client
    transport = Transport(uuid.uuid4().hex[:8])
    _opened(transport, client)
    (first,) = transport.map(client, [(operator.add, 1, 1)], [[0]])
    _, alone, _ = transport.take(first)
    assert alone  # nothing else was out while it ran: a suspect that dies here is the culprit
    first.release()
    transport.map(client, [(operator.add, 1, 1), (operator.add, 2, 2)], [[1], [2]])
    taken = [transport.take(f)[1] for f in list(transport.pending)]
    assert taken == [False, False]
    transport.close()


def test_a_stopped_transport_submits_nothing_and_cancel_cancels_what_is_out(cluster: Any) -> None:
    client = cluster.client
    name = f"transport-{uuid.uuid4().hex[:8]}"
    transport = Transport(uuid.uuid4().hex[:8])
    _opened(transport, client)
    (out,) = transport.map(client, [(_wait_then, name, 1)], [[0]])
    try:
        assert transport.stop() is True  # one batch still out
        assert transport.map(client, [(operator.add, 1, 1)], [[1]]) == [None]
        transport.cancel(client)
        assert not transport.pending and list(transport.completions()) == []
        assert out.status == "cancelled"
    finally:
        Event(name, client=client).set()
        transport.close()



def test_a_direct_batch_and_a_task_come_back_through_the_same_completions(cluster: Any) -> None:
    # The engine's one interface: a batch sent to a worker directly, then one as a Dask task
    # (as after the direct time): both come back from `completions` with their items and
    # their results, and only the first is a direct call.
    import pickle

    import cloudpickle

    from nbcluster import worker
    from nbcluster.run.capture import Job
    from nbcluster.run.cell import plan
    from nbcluster.run.engine import Shipment
    from nbcluster.run.transport import Call, task

    client = cluster.client
    run_id = uuid.uuid4().hex[:8]
    job = Job(plan(over=[3, 4, 5], evaluate=lambda *_: None), fn=abs, sent_from=0)
    shipment = Shipment(run_id)
    shipment.ship(client, job)
    assert shipment.context is not None
    transport = Transport(run_id)
    assert transport.open(Link(Needs(), client=client, find=lambda name: None).open()) is True
    assert transport.send_direct([0, 1], shipment.context, cloudpickle.dumps(([0, 1], [-3, -4], None)), "t")
    call = task(worker.run_batch, shipment.context, cloudpickle.dumps(([2], [-5], None)), "t")
    (future,) = transport.map(client, [call], [[2]])
    back = _all_back(transport, client)
    transport.close()
    assert {type(f) is Call for f in back} == {True, False} and future in back
    values = {tuple(batch): pickle.loads(blob)["values"] for batch, blob in back.values()}
    assert values == {(0, 1): [3, 4], (2,): [5]}


def _back(transport: Transport, client: Any) -> dict[tuple[int, ...], Any]:
    return {tuple(batch): result for batch, result in _all_back(transport, client).values()}


def test_a_run_reads_its_own_pushes_and_no_one_elses(cluster: Any) -> None:
    # What a user sees of pushed results: each batch's own result, whether its push came
    # before its end (read without a gather) or not at all (gathered). A push for a key the
    # run does not expect (another kernel's run, or one of this run's before it was
    # submitted, as a recompute's) never stands in for a result, nor one after the run closed.
    def _push(pushes: list[tuple[str, bytes]], value: int, after: str = "") -> int:
        # Pushes each blob for its task key (its own, or another's), then returns `value`;
        # with `after`, it waits for that `distributed.Event` first. Nested, so that it
        # travels by value: the workers cannot import the tests.
        from distributed import Event, get_worker

        from nbcluster._wire import PUSHED_TOPIC

        if after:
            Event(after).wait(60)
        for key, blob in pushes:
            get_worker().log_event(PUSHED_TOPIC, {"key": key, "report": blob})
        return value

    client = cluster.client
    run_id, foreign = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    transport = Transport(run_id)
    _opened(transport, client)
    transport.map(client, [(_push, [(f"distribute-{run_id}-0", b"pushed")], 0)], [[0]])
    assert _back(transport, client) == {(0,): b"pushed"}  # the push, not the gathered 0
    strays = [(f"distribute-{foreign}-0", b"foreign"), (f"distribute-{run_id}-2", b"early")]
    transport.map(client, [(_push, strays, 1)], [[1]])
    assert _back(transport, client) == {(1,): 1}  # nothing pushed for its own key: gathered
    transport.map(client, [(operator.add, 1, 1)], [[2]])
    assert _back(transport, client) == {(2,): 2}, "the early push stood in for the result"
    other = Transport(foreign)
    _opened(other, client)
    other.map(client, [(operator.add, 2, 3)], [[0]])
    assert _back(other, client) == {(0,): 5}, "another run's push stood in for the result"
    other.close()
    # Closed while its last batch runs: that batch's push is dropped, not kept.
    name, late = f"transport-{uuid.uuid4().hex[:8]}", f"distribute-{run_id}-3"
    (out,) = transport.map(client, [(_push, [(late, b"late")], 3, name)], [[3]])
    transport.close()
    Event(name, client=client).set()
    assert out.result(timeout=60) == 3  # its push came before the task's end
    assert transport.results(client, [out], gather=False) == [None]
