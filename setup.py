"""Builds the compiled modules; the rest is pyproject.toml.

- ``tsi_core/_kernel.pyx``, ``_bandit.pyx``: the algorithm's rounds (the kernel);
- ``flows/service/*/*.pyx``: the service's per-event hot path (draws, parsing, the shard's
  event loop), each with a Python reference its tests compare it against.

The flags make the arithmetic the same on every machine: no fast-math, no fused
multiply-add contraction (compilers contract a*b + c by default on some targets), IEEE
semantics for every operation. ``-g0`` drops the debug information Python's own flags ask
for (``-g``): nothing reads it, and writing it is a good part of each module's compile.
Cython is fetched by pip as a build requirement.

The modules are independent, so both steps run them in parallel, one worker a CPU (or
``TSI_BUILD_JOBS``): Cython's translation (``nthreads``) and the C compiler (setuptools'
``build_ext --parallel``, set here so that it also holds inside pip's editable install,
which runs this file with no command-line options).
"""

import os
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

DETERMINISTIC = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-unsafe-math-optimizations"]
NO_DEBUG_INFO = ["-g0"]
SOURCES = sorted(Path("tsi_core").glob("*.pyx")) + sorted(Path("flows/service").rglob("*.pyx"))


def build_jobs() -> int:
    """The workers of each step: ``TSI_BUILD_JOBS``, else the CPUs this process may use."""
    asked = os.environ.get("TSI_BUILD_JOBS", "")
    if not asked and hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    if not asked:
        return os.cpu_count() or 1
    if not asked.isdigit() or int(asked) < 1:
        raise SystemExit(f"TSI_BUILD_JOBS must be a whole number of workers, 1 or more: {asked!r}")
    return int(asked)


JOBS = build_jobs()

setup(
    ext_modules=cythonize(
        [
            Extension(
                ".".join(source.with_suffix("").parts),
                [str(source)],
                include_dirs=[str(source.parent)],
                extra_compile_args=DETERMINISTIC + NO_DEBUG_INFO,
            )
            for source in SOURCES
        ],
        compiler_directives={"language_level": "3"},
        nthreads=JOBS,
    ),
    options={"build_ext": {"parallel": JOBS}},
)
