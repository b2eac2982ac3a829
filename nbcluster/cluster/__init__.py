"""Cluster lifecycle: spec, supervisor process, registry, client-side handle, GPUs, backends."""
