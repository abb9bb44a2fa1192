"""User code on every worker: the plugin modules travel with the actors' runtime environment.

The driver names the modules every actor must import (`raymm.app.plugins.worker_code`) and
the local folders (or single files) of their top-level packages. `plugin_runtime_env` uploads
those to the cluster as Ray `py_modules` (content-addressed: an unchanged plugin is uploaded
once) and returns the runtime environment the ServerActor and every DeviceActor are created
with. On each node Ray unpacks the packages onto the worker's path, so a node where the plugin
is not installed runs it; the actors' constructors call `import_plugins` before anything that
refers to a plugin (a policy, a loader's data, a model factory's name) reaches them.

The environment is the actors' own and merges with the job's (`ray job submit
--working-dir`, a `runtime_env` given to `ray.init`): the job's `py_modules` are kept.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import ray

#: the modules an actor imports first, comma-separated (set by the actors' runtime environment)
PLUGINS_VAR = "RAYMM_PLUGINS"


def import_plugins() -> None:
    """Import the modules the actor's runtime environment names, so their registrations
    exist here before any argument that refers to them is unpickled."""
    for name in os.environ.get(PLUGINS_VAR, "").split(","):
        if name.strip():
            try:
                importlib.import_module(name.strip())
            except Exception as exc:  # what failed where: the driver imported it fine
                raise RuntimeError(
                    f"plugin {name.strip()!r} failed to import on the Ray node "
                    f"{ray.util.get_node_ip_address()}: {type(exc).__name__}: {exc} (what the "
                    "plugin's own package imports must be installed on every node)") from exc


def plugin_runtime_env(modules: Sequence[str], paths: Sequence[str]) -> dict[str, Any] | None:
    """The actors' runtime environment for these plugin modules and package paths (None when
    there are none). Needs a connected Ray: the packages are uploaded to its object store."""
    if not modules:
        return None
    env: dict[str, Any] = {"env_vars": {PLUGINS_VAR: ",".join(modules)}}
    if paths:
        env["py_modules"] = [*_job_py_modules(), *_upload(paths)]
    return env


def _job_py_modules() -> list[str]:
    """The job's own `py_modules` (URIs already): an actor's list would replace them."""
    job = ray.get_runtime_context().runtime_env
    return list(job.get("py_modules") or [])


def _upload(paths: Sequence[str]) -> list[str]:
    """Upload local package folders or files; their `gcs://` URIs. An actor's runtime
    environment takes URIs only (`ray.init` uploads local paths itself, but raymm may run in a
    Ray someone else started), so this calls the upload `ray.init` uses."""
    # deferred: Ray's private packaging helpers, needed only when a run ships plugins
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    with tempfile.TemporaryDirectory(prefix="raymm-plugins-") as scratch:
        env = upload_py_modules_if_needed({"py_modules": list(paths)}, include_gitignore=True,
                                          scratch_dir=scratch)
    return list(env["py_modules"])
