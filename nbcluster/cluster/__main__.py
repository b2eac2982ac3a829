"""``python -m nbcluster.cluster --ready-fd FD --log PATH``: a cluster's supervisor process.

How `launcher` starts every supervisor (the process itself is `supervisor.main`). Not
``python -m nbcluster.cluster.supervisor``: multiprocessing's spawn makes every worker
process the supervisor starts import the main module again, and that one is the whole
supervisor (its deployments, the metrics plugin; about 40 ms per worker, on the path to a
cluster's first result). A package's ``__main__`` is the one main module spawn never
imports again, so a worker imports only what it runs.

Its first act, before it imports the supervisor (Dask's scheduler and the rest, most of its
start-up), is to start the forkserver its workers will be forked from (`forkserver.py`),
which then loads the workers' modules on another core meanwhile; not for a request whose
workers run elsewhere (``--no-forkserver``: a batch system's, a gateway's...).
"""

if __name__ == "__main__":
    import sys

    from nbcluster import _start_up

    _start_up.begin()

    from nbcluster import config
    from nbcluster.cluster import forkserver

    forkserver.start_as_launched()  # the launcher's prediction of the workers' environment
    if "--no-forkserver" not in sys.argv:  # launcher.NO_FORKSERVER: workers elsewhere
        forkserver.start_ahead()

    with config.libyaml():  # Dask's config files, read again after the request: its own process
        from nbcluster.cluster.supervisor import main

        sys.exit(main())
