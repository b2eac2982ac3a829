"""Each item starts from the notebook's state (issue 37, defect 1), on the shared real cluster.

The cluster has 2 workers of 1 thread: 16 items put about 8 on each, so a value shared by
the items of a worker shows as ``1, 2, ..., 8`` where each item should see its own copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbcluster
from nbcluster.run.capture import capture, shareable
from tests.shell_helpers import cell

COUNTER = """
class Counter:
    def __init__(self):
        self.n = 0

    def bump(self):
        self.n += 1
        return self.n

counter = Counter()
"""


@pytest.fixture
def notebook(shell: InteractiveShell, cluster: Any) -> InteractiveShell:
    """The shell, on the shared cluster, with a `Counter` and a `counter` defined."""
    cell(shell, COUNTER)
    return shell


def main_namespace(source: str) -> dict[str, Any]:
    """Names defined as a notebook defines them (module ``__main__``: they travel by value)."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, "<notebook>", "exec"), namespace)
    return namespace


def test_the_issues_counter_gives_sixteen_ones(notebook: InteractiveShell) -> None:
    cell(notebook, '%%distribute --over "i in range(16)" --into bumps\ncounter.bump()')
    assert list(notebook.user_ns["bumps"]) == [1] * 16
    assert notebook.user_ns["counter"].n == 0  # the notebook's own object is untouched


def test_a_list_each_item_appends_to(notebook: InteractiveShell) -> None:
    cell(notebook, "box = []")
    cell(notebook, '%%distribute --over "i in range(16)" --into lens\nbox.append(i)\nlen(box)')
    assert list(notebook.user_ns["lens"]) == [1] * 16


def test_a_function_that_reads_a_mutable_global_gets_its_own_copy(notebook: InteractiveShell) -> None:
    cell(notebook, "def bump_it(i):\n    return counter.bump()")
    cell(notebook, '%%distribute --over "i in range(16)" --into bumps\nbump_it(i)')
    assert list(notebook.user_ns["bumps"]) == [1] * 16
    # A function and the object it reads, both captured: one object in each item, as here.
    cell(notebook, '%%distribute --over "i in range(16)" --into pairs\nbump_it(i) + counter.n')
    assert list(notebook.user_ns["pairs"]) == [2] * 16


def test_a_small_array_each_item_adds_one_to(notebook: InteractiveShell) -> None:
    cell(notebook, "import numpy as np\nsmall = np.zeros(10)")
    cell(notebook, '%%distribute --over "i in range(16)" --into sums\nsmall += 1\nfloat(small[0])')
    assert list(notebook.user_ns["sums"]) == [1.0] * 16
    assert notebook.user_ns["small"][0] == 0.0


def test_a_large_array_is_shared_read_only_and_a_write_names_it(notebook: InteractiveShell, capsys: Any) -> None:
    cell(notebook, "import numpy as np\nbig = np.ones(300_000)")  # 2.4 MB: shipped once per worker
    assert list(cell(notebook, '%%distribute --over "i in range(8)"\nfloat(big.sum()) + i')) == [
        300_000.0 + i for i in range(8)
    ]
    capsys.readouterr()
    cell(notebook, '%%distribute --over "i in range(8)" --into wrote\nbig[0] = i\nfloat(big[0])')
    results = notebook.user_ns["wrote"]
    assert len(results.errors) == 8
    message = str(results.errors[0])
    assert "`big` is a large captured array, which the items share read-only" in message
    assert "big = big.copy()" in message
    err = capsys.readouterr().err
    assert "8/8 items failed: ValueError" in err and "`big`" in err
    # The fix the line names works, and the notebook's array is still its own, writeable.
    fixed = cell(notebook, '%%distribute --over "i in range(8)"\nbig = big.copy()\nbig += 1\nfloat(big[0])')
    assert list(fixed) == [2.0] * 8
    assert notebook.user_ns["big"].flags.writeable and notebook.user_ns["big"][0] == 1.0


def test_a_function_that_reads_a_large_array_is_loaded_once_and_the_array_is_read_only(
    notebook: InteractiveShell,
) -> None:
    cell(notebook, "import numpy as np\nbig = np.ones(300_000)\n"
                   "def total(i):\n    return float(big.sum()) + i\n"
                   "def spoil(i):\n    big[0] = i")  # fmt: skip
    ids = cell(notebook, '%%distribute --over "i in range(16)"\n(total(i), id(total))')
    assert [t for t, _ in ids] == [300_000.0 + i for i in range(16)]
    assert len({f for _, f in ids}) <= 2  # one function per worker, not one per item
    cell(notebook, '%%distribute --over "i in range(4)" --into spoiled\nspoil(i)')
    assert "`big` is a large captured array" in str(notebook.user_ns["spoiled"].errors[0])
    # In the kernel (--local) the function reads the notebook's own array: it gets a copy.
    cell(notebook, '%%distribute --over "i in range(4)" --local all --into here\nspoil(i)')
    assert notebook.user_ns["here"].ok and notebook.user_ns["big"][0] == 1.0


MODEL = """
import numpy as np

class Model:
    def __init__(self):
        self.weights = np.ones(300_000)  # 2.4 MB: the object is large
        self.history = []

    def step(self, i):
        self.history.append(i)
        return len(self.history), float(self.weights.sum()), self.weights.ctypes.data

model = Model()
"""


def test_a_large_object_is_each_items_own_around_its_shared_read_only_arrays(notebook: InteractiveShell) -> None:
    # Each item gets its own object (its list starts empty) without a copy of its 2.4 MB of
    # weights: the items of a worker read the same memory, read-only.
    cell(notebook, MODEL)
    steps = cell(notebook, '%%distribute --over "i in range(16)"\nmodel.step(i)')
    assert [(n, total) for n, total, _ in steps] == [(1, 300_000.0)] * 16
    assert len({address for _, _, address in steps}) <= 2  # one array per worker, not one per item
    cell(notebook, '%%distribute --over "i in range(4)" --into trained\nmodel.weights -= 0.5\nmodel.step(i)')
    message = str(notebook.user_ns["trained"].errors[0])
    assert "`model` holds large arrays, which the items share read-only" in message
    assert "model = copy.deepcopy(model)" in message
    # The fix the line names works, and the notebook's object is as it was.
    fixed = cell(notebook, '%%distribute --over "i in range(4)"\nimport copy\nmodel = copy.deepcopy(model)\n'
                           'model.weights -= 0.5\nmodel.step(i)[:2]')  # fmt: skip
    assert list(fixed) == [(1, 150_000.0)] * 4
    assert notebook.user_ns["model"].history == [] and notebook.user_ns["model"].weights[0] == 1.0


def test_a_function_that_reads_a_large_object_gets_its_own_copy_around_shared_arrays(cluster: Any) -> None:
    ns = main_namespace(MODEL + "def step(i):\n    return model.step(i)\ndef train(i):\n    model.weights -= 0.5\n")
    steps = nbcluster.distribute(ns["step"], over=range(16)).values()
    assert [(n, total) for n, total, _ in steps] == [(1, 300_000.0)] * 16
    assert len({address for _, _, address in steps}) <= 2
    trained = nbcluster.distribute(ns["train"], over=range(4))
    assert len(trained.errors) == 4 and "`model` holds large arrays" in str(trained.errors[0])
    # In the kernel (--local) too, and the notebook's own object stays writeable and as it was.
    here = nbcluster.distribute(ns["step"], over=range(4), local="all").values()
    assert [(n, total) for n, total, _ in here] == [(1, 300_000.0)] * 4
    assert "`model` holds large arrays" in str(nbcluster.distribute(ns["train"], over=range(2), local="all").errors[0])
    assert ns["model"].history == [] and ns["model"].weights.flags.writeable and ns["model"].weights[0] == 1.0


def test_a_function_gets_its_own_small_arrays_and_local_copies_only_what_it_reads(cluster: Any) -> None:
    # In the kernel a notebook function's globals are the whole namespace, which may hold what
    # cannot be pickled (IPython's own objects, an open connection): only what it reads is copied.
    ns = main_namespace(COUNTER + "import numpy as np, threading\nlock = threading.Lock()\n"
                        "small = np.zeros(4)\nbig = np.ones(300_000)\n"
                        "def bump(i):\n    small[0] += 1\n    return counter.bump() + small[0] + big[0]\n"
                        "pickled = []\nclass Spy:\n    def __reduce__(self):\n        pickled.append(1)\n"
                        "        return Spy, ()\nspy = Spy()\n")  # fmt: skip
    assert nbcluster.distribute(ns["bump"], over=range(4), local="all").values() == [3.0] * 4
    assert ns["pickled"] == []  # what the function does not read is left alone
    assert nbcluster.distribute(ns["bump"], over=range(8)).values() == [3.0] * 8
    assert ns["small"][0] == 0.0 and ns["counter"].n == 0


def test_a_large_dataframe_is_each_items_own(notebook: InteractiveShell) -> None:
    cell(notebook, "import numpy as np, pandas as pd\nframe = pd.DataFrame({'a': np.zeros(200_000)})")  # 1.6 MB
    out = cell(notebook, '%%distribute --over "i in range(16)"\n'
                         'frame.iloc[0, 0] += 1\nframe["b"] = i\n(float(frame.iloc[0, 0]), list(frame.columns))')  # fmt: skip
    assert list(out) == [(1.0, ["a", "b"])] * 16
    assert list(notebook.user_ns["frame"].columns) == ["a"]


def test_local_items_get_copies_too(notebook: InteractiveShell) -> None:
    cell(notebook, '%%distribute --over "i in range(6)" --local all --into bumps\ncounter.bump()')
    assert list(notebook.user_ns["bumps"]) == [1] * 6
    assert notebook.user_ns["counter"].n == 0
    cell(notebook, "import numpy as np\nbig = np.ones(300_000)")
    local = cell(notebook, '%%distribute --over "i in range(2)" --local all --into w\nbig[0] = 5')
    assert local is None and "share read-only" in str(notebook.user_ns["w"].errors[0])
    assert notebook.user_ns["big"][0] == 1.0


def test_local_says_so_when_a_value_cannot_be_copied(notebook: InteractiveShell, capsys: Any) -> None:
    cell(notebook, "import threading\nlock = threading.Lock()")
    capsys.readouterr()
    assert list(cell(notebook, '%%distribute --over "i in range(2)" --local all\nlock.locked()')) == [False] * 2
    assert (
        "nbcluster: --local: `lock` cannot be copied for each item (TypeError: cannot pickle '_thread.lock' "
        "object); the items in the kernel share the notebook's own object"
    ) in capsys.readouterr().out.splitlines()


def test_distribute_a_function_and_a_cell(cluster: Any) -> None:
    ns = main_namespace(COUNTER + "def bump(i):\n    return counter.bump()\n")
    assert nbcluster.distribute(ns["bump"], over=range(16)).values() == [1] * 16
    ns["big"] = np.ones(300_000)
    ns["small"] = np.zeros(10)
    cell_source = "small += 1\nfloat(small[0]) + float(big[0]) + counter.bump()"
    assert nbcluster.distribute(cell_source, over="i in range(16)", namespace=ns).values() == [3.0] * 16
    wrote = nbcluster.distribute("big[:] = 0", over="i in range(4)", namespace=ns)
    assert len(wrote.errors) == 4 and "`big` is a large captured array" in str(wrote.errors[0])
    assert ns["counter"].n == 0 and ns["small"][0] == 0.0 and ns["big"][0] == 1.0
    ns["text"] = "x" * 2_000_000  # large and immutable: shared as it is
    assert nbcluster.distribute("len(text)", over="i in range(4)", namespace=ns).values() == [2_000_000] * 4
    # A function that reads only a large array: loaded once per worker, the array read-only.
    arrays = main_namespace("def where(i):\n    return id(big)\ndef spoil(i):\n    big[0] = i\n")
    arrays["big"] = ns["big"]
    assert len(set(nbcluster.distribute(arrays["where"], over=range(16)).values())) <= 2
    spoiled = nbcluster.distribute(arrays["spoil"], over=range(4))
    assert len(spoiled.errors) == 4 and "`big` is a large captured array" in str(spoiled.errors[0])


def test_only_what_an_item_could_change_is_copied() -> None:
    ns = main_namespace(
        COUNTER
        + "K = 3\nNAMES = ('a', 1, None)\nimport math\n"
        + "def scaled(x):\n    return x * K + math.floor(x)\n"
        + "def bumped(x):\n    return counter.bump() + x\n"
        + "def calls(x):\n    return bumped(x)\n"
        + "def outer():\n    box = []\n    return lambda x: box\n"
    )
    assert all(shareable(ns[n]) for n in ("K", "NAMES", "math", "scaled", "Counter"))
    assert all(shareable(v) for v in (np.sum, np.add, np.float64(1.5), np.dtype("f8"), len))
    assert not any(shareable(v) for v in (ns["counter"], ns["bumped"], ns["calls"], ns["outer"](), [1], {}))
    captured = capture({"K": 1, "NAMES": 1, "scaled": 1, "counter": 1, "calls": 1}, ns)
    assert captured.copied == ["counter", "calls"]
    # A cell of shared values maps its items with no copy per item.
    assert capture({"K": 1}, ns).copied == []
