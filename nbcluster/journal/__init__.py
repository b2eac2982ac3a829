"""A run's journal: every finished item on disk as it arrives, so `--resume` can skip it.

`store` (the append-only file of finished items, written), `reading` (its format, read back,
and the journals' folder), `identity` (what makes two runs the same
run), `resume` (which journal a run writes and what it takes from an earlier one), `runs`
(listing and forgetting journals), `checkpoints` (where trials' `checkpoint()` files live, pruned
with their journal). All of it runs in the kernel.
"""
