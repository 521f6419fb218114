"""Code that runs in the KREX daemon: the server (daemon), admission, regions (the only
writer of region state), the node machinery (gates, drains, freezing, pinning), device memory,
the warm pool's management (workers), segments, GPUs (node), MPS, metrics and status views.
Never imports the client."""
