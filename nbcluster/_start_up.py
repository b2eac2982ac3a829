"""The name of the variable nbcluster's own processes start with (read first by `nbcluster`)."""

#: Set in the environment of nbcluster's own processes as they start (a supervisor, the
#: forkserver of its workers), and gone from it at ``import nbcluster``, first thing: they
#: spend most of their start-up importing Dask, with the cyclic garbage collector finding
#: nothing to collect in the new modules (a tenth of that time). It stays off until the
#: process has loaded what it runs, then is on again with those objects frozen
#: (`gc.freeze`: no collection scans them again).
START_UP_VARIABLE = "NBCLUSTER_START_UP"
