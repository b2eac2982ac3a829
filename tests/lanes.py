"""Which tests run in which lane: the markers conftest gives by module or by test."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

# Test module (or `module::test`) -> its lanes. `browser`: headless Chromium; `services`: a
# real SLURM, sshd, dask-gateway, network namespaces or JupyterHub started by the test;
# `root`: needs root (daemons that switch users, `ip netns`, sshd logins as root); `slow`:
# left out of the quick lane (`-m "not slow"`): each test starts its own clusters, kernels,
# servers or services, seconds to minutes apiece. The quick lane runs on the shared cluster.
LANES: dict[str, tuple[str, ...]] = {
    "test_live_browser": ("browser", "slow"),
    "test_panel_browser": ("browser", "slow"),
    "test_widgets_browser": ("browser", "slow"),
    "test_docs_screenshots": ("browser", "slow"),
    "test_docs_vscode": ("browser", "slow"),
    "test_slurm": ("services", "root", "slow"),
    "test_sge": ("services", "root", "slow"),
    "test_course_slurm": ("services", "root", "slow"),
    "test_ssh": ("services", "root", "slow"),
    "test_netns": ("services", "root", "slow"),
    "test_gateway": ("services", "slow"),
    "test_hub": ("services", "root", "slow"),
    "test_hub_dashboard": ("slow",),
    "test_hub_limits": ("slow",),
    "test_notebooks": ("slow",),
    "test_nbgrader": ("slow",),
    "test_binder": ("slow",),
    "test_load": ("slow",),
    "test_cluster": ("slow",),
    "test_cli": ("slow",),
    "test_lifecycle": ("slow",),
    "test_gpu": ("slow",),
    "test_external": ("slow",),
    "test_widgets_kernel": ("slow",),
    "test_kubernetes_spec": ("slow",),
    "test_scale": ("slow",),
    "test_ranks": ("slow",),  # a cluster of its own, whose workers its failure tests end
    "test_rank_jobs": ("slow",),  # the same; and two kernels, each with its own cluster
    "test_ranks::test_ranks_span_two_namespace_hosts": ("services", "root", "slow"),
    "test_worker_local::test_built_once_per_worker_reused_then_rebuilt_after_restart": ("slow",),
    "test_magics::test_kernel_killed_leaves_no_processes": ("slow",),
    "test_magics::test_cluster_magic_lifecycle": ("slow",),
    "test_magics::test_use_switches_the_current_cluster": ("slow",),
    "test_worker_env::test_the_worker_environment_is_a_dask_setting": ("slow",),
    "test_limits::test_cli_refuses_and_config_caps_hold_against_force": ("slow",),
    "test_limits::test_force_starts_past_the_machine_memory_limit": ("slow",),
    "test_server::test_a_cluster_through_every_route": ("slow",),
    "test_engine::test_a_cluster_killed_mid_cell_ends_the_cell_with_one_line": ("slow",),
    "test_direct::test_a_worker_that_dies_under_a_direct_batch_*": ("slow",),
    "test_bad_input::test_cluster_stop_in_*": ("slow",),
    "test_docs::test_site_*": ("slow",),
    "test_docs::test_teaching_*": ("slow",),
    "test_docstring_examples::test_docstring_example_runs_on_a_cluster": ("slow",),
}


def lanes(module: str, test: str) -> tuple[str, ...]:
    """The markers `LANES` gives test function `test` of module `module` (``test_slurm``)."""
    return tuple(
        m
        for pattern, marks in LANES.items()
        if fnmatchcase(module, pattern) or fnmatchcase(f"{module}::{test}", pattern)
        for m in marks
    )


def root_skip(euid: int) -> pytest.MarkDecorator | None:
    """The skip a `root` test gets when pytest runs as user `euid`; None as root."""
    if euid == 0:
        return None
    return pytest.mark.skip(
        reason="needs root (it starts daemons that switch users, network namespaces or root sshd logins); "
        "run as root, as .ci/run does"
    )
