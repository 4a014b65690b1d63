"""Where arrays live: the mesh and the sharding rules of params and decode state
(sharding.py), and what processes agree on in multi-host runs (multihost.py)."""
