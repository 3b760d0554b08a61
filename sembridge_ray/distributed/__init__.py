"""The Ray executor, the only package that imports Ray: the cluster connection (``cluster.py``),
Ray Data actor pools, tasks and held objects (``executor.py``), Ray Train (``train_run.py``). The
jobs' runs (``sembridge_ray.recipes``) ask it through the executor interface."""

import os

from sembridge_ray.runtime.logs import apply_ray_environment

# Ray's forwarded worker lines without colour codes in files and without its known false alarms
# (sembridge_ray.runtime.logs); the skip pattern is read when ray is first imported.
apply_ray_environment()

if not os.environ.get("RAY_ADDRESS"):
    # A local cluster binds to loopback only. Ray resolves 127.0.0.1 to the external interface
    # unless it thinks it runs single-node (ray_constants.ENABLE_RAY_CLUSTER, read when ray is first
    # imported), so this must run before `import ray`. Token auth is off for such a loopback-only
    # cluster unless the user sets the mode.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
