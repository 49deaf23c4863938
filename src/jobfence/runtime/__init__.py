"""The runtime: the worker, the harness and its batch runner, and the background duties."""
