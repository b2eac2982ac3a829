"""`distribute()`'s grouped keywords (`needs=`, `on=`), `everywhere()`, and the old spellings.

On a cluster of this module's own: one CPU worker and one GPU worker. There is no GPU on the
test machine, so the GPU worker is nbcluster's *simulated* one (NBCLUSTER_SIMULATE_GPUS=1):
a real Dask worker process that advertises the `GPU` resource and gets
`CUDA_VISIBLE_DEVICES`, as a real GPU worker would; only the device behind it is missing.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbcluster
from nbcluster import _current
from nbcluster.cluster.handle import ClusterHandle, start
from nbcluster.errors import BadArgument
from nbcluster.run.api import OLD, distribute, everywhere, notice, ranks

WHERE = "from distributed import get_worker\nimport os\n(get_worker().name, os.environ.get('CUDA_VISIBLE_DEVICES'))"
GPU, CPU = ("gpu-0", "0"), "cpu-0"
NAME = "api-shape"


@pytest.fixture(scope="module")
def mixed() -> Iterator[ClusterHandle]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NBCLUSTER_SIMULATE_GPUS", "1")
        handle = start(workers=1, threads=1, gpu_workers=1, name=NAME)
    try:
        handle.client.wait_for_workers(2, timeout=60)
        yield handle
    finally:
        _current.forget(NAME)  # the handle `on=NAME` found (and its client), before the cluster goes
        handle.stop()


def ns() -> dict[str, Any]:
    return {"__name__": "__main__"}


@pytest.fixture
def no_notices() -> Iterator[None]:
    """The new spellings warn of nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        yield


def test_needs_places_items_as_the_flags_do(mixed: ClusterHandle, no_notices: None) -> None:
    on_gpu = distribute(WHERE, over="x in range(4)", needs=nbcluster.Needs(gpus=1), on=mixed, namespace=ns())
    assert set(on_gpu) == {GPU}
    on_cpu = distribute(WHERE, over="x in range(4)", needs={"cpu_only": True}, on=mixed, namespace=ns())
    assert {name for name, _ in on_cpu} == {CPU}
    assert {name for name, _ in distribute(WHERE, over=[1, 2], needs={"cpus": 1}, on=mixed, namespace=ns())} == {CPU}
    with pytest.raises(BadArgument, match=r"no worker offers GPU=2 per item"):
        distribute(WHERE, over=[1], needs=nbcluster.Needs(gpus=2), on=mixed, namespace=ns())


def test_on_takes_a_name_a_handle_or_a_client(mixed: ClusterHandle, no_notices: None) -> None:
    for on in (NAME, mixed, mixed.client):
        results = distribute(lambda x: x + 1, over=range(3), on=on)
        assert results.values() == [1, 2, 3], on
        assert results.client is not None and results.client.scheduler.address == mixed.address


def test_everywhere_is_a_function_of_its_own(mixed: ClusterHandle, no_notices: None) -> None:
    home = ns()
    everywhere(WHERE, on=mixed, into="setup", namespace=home)
    assert sorted(name for name, _ in home["setup"]) == [CPU, "gpu-0"]
    assert list(everywhere(WHERE, on=mixed, needs=nbcluster.Needs(gpus=1), namespace=ns())) == [GPU]


def test_everywhere_writes_into_the_callers_globals(mixed: ClusterHandle, no_notices: None) -> None:
    everywhere(lambda: 1, on=mixed, into="_api_shape_setup")
    try:
        assert globals()["_api_shape_setup"].values() == [1, 1]
    finally:
        globals().pop("_api_shape_setup", None)


# Each old keyword of distribute(): what it is given, and what the run then gives back.
OLD_RUNS = {
    "gpus": ({"gpus": 1, "over": "x in range(3)"}, lambda r: set(r) == {GPU}),
    "cpus": ({"cpus": 1, "over": "x in range(3)"}, lambda r: {n for n, _ in r} == {CPU}),
    "cpu_only": ({"cpu_only": True, "over": "x in range(3)"}, lambda r: {n for n, _ in r} == {CPU}),
    "cluster": ({"cluster": NAME, "over": "x in range(2)"}, lambda r: len(r) == 2),
    "client": ({"over": "x in range(2)"}, lambda r: len(r) == 2),  # the client is added below
    "everywhere": ({"everywhere": True}, lambda r: sorted(n for n, _ in r) == [CPU, "gpu-0"]),
    "first_line": ({"first_line": 2, "over": "x in range(2)"}, lambda r: len(r) == 2),
}


@pytest.mark.parametrize("old", sorted(OLD_RUNS))
def test_each_old_keyword_still_works_with_one_line_naming_the_new(mixed: ClusterHandle, old: str) -> None:
    given, check = OLD_RUNS[old]
    given = dict(given)
    if old == "client":
        given["client"] = mixed.client
    elif old != "cluster":
        given["on"] = mixed
    with pytest.warns(FutureWarning) as caught:
        results = distribute(WHERE, namespace=ns(), **given)
    assert check(results), results.values()
    [warning] = [w for w in caught if issubclass(w.category, FutureWarning)]
    line = str(warning.message)
    assert "\n" not in line and line == notice("distribute", old)
    assert warning.filename == __file__  # it points at the caller's line, not at nbcluster
    if old in OLD:
        assert f"`distribute({old}=...)` is now `{OLD[old].format(fn='distribute')}`" in line


def test_the_notices_name_each_new_spelling() -> None:
    assert notice("distribute", "gpus") == (
        "`distribute(gpus=...)` is now `distribute(needs=nbcluster.Needs(gpus=N))`; the old spelling goes in the next release."
    )
    assert notice("distribute", "client") == (
        "`distribute(client=...)` is now `distribute(on=client)`; the old spelling goes in the next release."
    )
    assert notice("distribute", "everywhere").startswith("`distribute(everywhere=...)` is now `nbcluster.everywhere(body)`")
    assert notice("distribute", "cluster").startswith('`distribute(cluster=...)` is now `distribute(on="NAME")`')


def test_ranks_takes_needs_and_on_and_has_no_old_keywords(mixed: ClusterHandle) -> None:
    def where() -> tuple[str, str | None]:
        import os

        from distributed import get_worker

        return get_worker().name, os.environ.get("CUDA_VISIBLE_DEVICES")

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert ranks(where, n=1, needs=nbcluster.Needs(gpus=1), on=mixed).values() == [GPU]
    # ranks() came after the release that had distribute(gpus=...): one line names the new spelling.
    with pytest.raises(BadArgument, match=r"^ranks\(\) has no option 'gpus'; did you mean `ranks\(needs=nbcluster\.Needs\(gpus=N\)\)`\?$"):
        ranks(where, n=1, gpus=1, on=mixed)
    with pytest.raises(BadArgument, match=r"^distribute\(\) has no option 'ranks'$"):  # nor had it in a release
        distribute(where, ranks=1, on=mixed)


def test_mistakes_get_one_line_before_anything_runs(mixed: ClusterHandle) -> None:
    cases = [
        ({"gpus": 1, "needs": {"gpus": 1}}, r"^give needs= only: gpus= is its old spelling$"),
        ({"client": mixed.client, "on": mixed}, r"^give on= only: client= is its old spelling$"),
        ({"retry": 2}, r"^distribute\(\) has no option 'retry'; did you mean 'retries'\?$"),
        ({"gpu": 1}, r"^distribute\(\) has no option 'gpu'; did you mean `distribute\(needs=nbcluster\.Needs\(gpus=N\)\)`\?$"),
        ({"needs": {"memory": "4GiB"}}, r"^needs= takes gpus, cpus, cpu_only; 'memory' is not one of them$"),
        ({"needs": {"gpu": 1}}, r"; did you mean 'gpus'\?$"),
        ({"needs": 1}, r"^needs= takes nbcluster\.Needs\(gpus=\.\.\., cpus=\.\.\., cpu_only=\.\.\.\) or a dict of them, got int$"),
        ({"needs": nbcluster.Needs(gpus=-1)}, r"^--gpus needs a number above 0, got -1$"),
        ({"on": 8786}, r"^on= takes a cluster's name, a ClusterHandle .* or a distributed\.Client, got int$"),
    ]
    for kwargs, message in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            with pytest.raises(BadArgument, match=message):
                distribute(lambda x: x, over=[1], **kwargs)
    with pytest.raises(BadArgument, match=r"^ranks\(\) has no option 'gpu'"):
        ranks(lambda: 1, n=1, gpu=1, on=mixed)
    with pytest.raises(BadArgument, match=r"--ranks 1 .* cannot be combined with --over"):
        ranks(lambda: 1, n=1, over=[1], on=mixed)


def test_the_magic_keeps_its_flags_and_warns_of_nothing(shell: InteractiveShell, mixed: ClusterHandle) -> None:
    _current.use(mixed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        shell.run_cell_magic("distribute", '--over "x in range(3)" --gpus 1 --into on_gpu', WHERE)
        shell.run_cell_magic("distribute", "--everywhere --cpu-only --into setup", WHERE)
    assert set(shell.user_ns["on_gpu"]) == {GPU}
    assert [name for name, _ in shell.user_ns["setup"]] == [CPU]
