"""Cluster lifecycle: spec, supervisor process and its launcher, registry, client-side handle,
GPUs, backends."""
