"""The ``docker`` runtime: one container per rollout, through the Python ``docker`` SDK.

``runtime.py`` is ``DockerRuntime`` (create, exec, artifacts, stop); beside it what a container is
made of: ``limits.py`` (CPU, memory, processes, logs), ``network.py`` (its network under each policy),
``storage.py``, ``quota.py`` and ``volumes.py`` (the disk quota), ``archive.py`` (files through the
engine's archive API), ``private.py`` (a command out of reach of the box's other processes),
``images.py`` (task images built by content) and ``sandbox.py`` (the default sandbox image).
This file imports nothing, so ``runtimes`` loads the SDK only when a docker runtime is used.
Must not import Prefect.
"""
