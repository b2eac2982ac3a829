"""Values kept on the workers (`--persist`): handles to them, their publishing and lifetime.

`handles` runs in the kernel; what holds the values on a worker is `nbcluster.worker.held`.
"""
