"""Device meshes and the partition rules that place params and decode state on them.

(Single-device placement for now; the full rule table arrives with the sharding issue.)
"""

from __future__ import annotations

import jax
from jax.sharding import SingleDeviceSharding

from lookahead_jax.config import LlamaConfig
from lookahead_jax.model import param_specs


def param_shardings(cfg: LlamaConfig, mesh) -> dict:
    """Flat {param path: Sharding}."""
    if mesh is not None:
        raise NotImplementedError("meshes are not supported yet")
    single = SingleDeviceSharding(jax.devices()[0])
    return {p: single for p in param_specs(cfg)}
