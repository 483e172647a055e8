"""Peers in their own processes: `protocol` is the worker side (run as `python -m hinabench.worker`
inside a peer's environment), `proxy` the harness side (a Backend that talks to it).

Nothing is imported here: a peer's environment must not be asked for more of hinabench than the
problem and the measurement.
"""
