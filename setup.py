"""Builds the compiled modules; the rest is pyproject.toml.

- ``tsi_core/_kernel.pyx``, ``_bandit.pyx``: the algorithm's rounds (the kernel);
- ``flows/service/*/*.pyx``: the service's per-event hot path (draws, parsing, the shard's
  event loop), each with a Python reference its tests compare it against.

The flags make the arithmetic the same on every machine: no fast-math, no fused
multiply-add contraction (compilers contract a*b + c by default on some targets), IEEE
semantics for every operation. Cython is fetched by pip as a build requirement.
"""

from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

DETERMINISTIC = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-unsafe-math-optimizations"]
SOURCES = sorted(Path("tsi_core").glob("*.pyx")) + sorted(Path("flows/service").rglob("*.pyx"))

setup(
    ext_modules=cythonize(
        [
            Extension(
                ".".join(source.with_suffix("").parts),
                [str(source)],
                include_dirs=[str(source.parent)],
                extra_compile_args=DETERMINISTIC,
            )
            for source in SOURCES
        ],
        compiler_directives={"language_level": "3"},
    )
)
