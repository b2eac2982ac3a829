"""Values kept on the workers (`--persist`): handles to them, their publishing and lifetime.

`handles` runs in the kernel, as does `locals` (what each worker keeps through
`nbcluster.worker_local`, for `%cluster status`); what holds the values on a worker is `nbcluster.worker.held`.
"""
