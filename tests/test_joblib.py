"""joblib's dask backend on an nbcluster cluster: what the clusters page says plain Dask code does.

After `%cluster start` (or `nbcluster.start`/`use`) the cluster's client is Dask's default
client, so `joblib.parallel_backend("dask")` sends scikit-learn's parallel work to its
workers, over the cluster's TLS connection.
"""

from __future__ import annotations

from typing import Any

import pytest


def test_grid_search_runs_on_the_tls_cluster_under_joblibs_dask_backend(cluster: Any) -> None:
    pytest.importorskip("sklearn", reason="scikit-learn is in the dev extra: pip install -e '.[dev]'")
    import joblib
    from distributed import get_task_stream
    from sklearn.datasets import make_classification
    from sklearn.model_selection import GridSearchCV
    from sklearn.tree import DecisionTreeClassifier

    assert cluster.address.startswith("tls://")  # the tests' shared cluster: TLS, like every nbcluster cluster
    workers = set(cluster.client.scheduler_info()["workers"])
    X, y = make_classification(n_samples=300, n_features=8, random_state=0)
    grid = {"max_depth": [1, 2, 3, 4, 5, 6]}

    def search(n_jobs: int) -> Any:
        return GridSearchCV(DecisionTreeClassifier(random_state=0), grid, cv=3, n_jobs=n_jobs)

    with joblib.parallel_backend("dask"), get_task_stream(cluster.client) as stream:
        parallel = search(-1).fit(X, y)
    ran_on = {record["worker"] for record in stream.data}
    # 6 settings x 3 folds = 18 fits, done as Dask tasks on the cluster's workers.
    assert ran_on and ran_on <= workers, (ran_on, workers)
    serial = search(1).fit(X, y)
    assert parallel.best_params_ == serial.best_params_
    assert list(parallel.cv_results_["mean_test_score"]) == list(serial.cv_results_["mean_test_score"])
