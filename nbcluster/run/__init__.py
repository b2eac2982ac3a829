"""Running a cell's work on a cluster: `%%distribute` and `nbcluster.distribute()`.

Every module here runs in the kernel. The magic parses its line (`options`) and calls
`api.launch` with the cell, the user's namespace and the flags as declared; Python code calls
`api.distribute` (or `everywhere`, `ranks`), which spells some options otherwise (``needs=``,
``on=``, and the old keywords for one release) and calls `launch`.

Set-up, with no Dask traffic: `options` (the flags, declared and checked once, and the
magic's line), `cell` (source -> code, free names; the items: `Plan`), `capture` (what
travels and how).
The run: `api` (checks, then the run's steps; `Job`, what runs, made once; `Run`, the
controls of a run), `engine` (the driver: it feeds events to the policy and performs
its actions; what a finished batch says; the backlog told to the adaptive scaler; the
context and large values sent ahead), `policy` (the scheduling policy as a pure state
machine: backlog, batch sizes, probes, suspects, retries), `transport` (the cluster link:
where items may run; submit, cancel, completions: Dask tasks, and `direct` batches sent to
a worker without the scheduler; results pushed by workers; tasks that fail, not hang, on a
worker without nbcluster), `everywhere` (one task pinned to each worker), `ranks` (`--ranks N`: N ranks
of one job, all or nothing), `trials` (reports, stoppers and timeouts of trial runs), `stoppers`
(ASHA, median, and the `Stopper` protocol), `trial_results` (`Results.metrics`, `best`).
What the user reads: `state` (each item's state and value), `results` (the read-only view, and waiting for it in the
kernel: output, summary, Ctrl-C), `tracebacks` (failed items).

What runs on the workers is the top-level package `nbcluster.worker`; the journal of
finished items and `--resume` are `nbcluster.journal`; values kept on the workers are
`nbcluster.persist`.
"""
