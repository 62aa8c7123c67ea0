"""How the guides' programs run: compiled for how long they run, vectorised over particles
and devices, and reporting from inside ``jit``.

* :mod:`~numpyro_dais.runtime.compilation` — XLA:CPU's cheaper code generation for programs
  whose run is short next to their compilation;
* :mod:`~numpyro_dais.runtime.vectorise` — particles over a mesh, chunked maps, a jit cache;
* :mod:`~numpyro_dais.runtime.reporting` — warnings from jitted code, from process 0 only;
* :mod:`~numpyro_dais.runtime.hostcall` — a Python function called from compiled code.
"""

from numpyro_dais.runtime.hostcall import host_call
from numpyro_dais.runtime.reporting import on_main_process, warn, warn_from_jit
from numpyro_dais.runtime.vectorise import (
    CompiledPrograms,
    jit_by_leaves,
    jit_short_run,
    map_batched,
    map_chunks,
    shard_particles,
)

__all__ = [
    "CompiledPrograms",
    "host_call",
    "jit_by_leaves",
    "jit_short_run",
    "map_batched",
    "map_chunks",
    "on_main_process",
    "shard_particles",
    "warn",
    "warn_from_jit",
]
