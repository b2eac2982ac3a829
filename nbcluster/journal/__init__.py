"""A run's journal: every finished item on disk as it arrives, so `--resume` can skip it.

`store` (the append-only file of finished items: its format, written and read back, and the
journals' folder, one folder per run identity; what makes two runs the same run, which
journal a run writes, and what it takes from an earlier one), `runs` (listing, showing and
forgetting journals, and where trials' `checkpoint()` files live). All of it runs in the
kernel.
"""
