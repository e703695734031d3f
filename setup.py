"""Builds the compiled kernel (tsi_core/_kernel.pyx, _bandit.pyx); the rest is pyproject.toml.

The flags make the arithmetic the same on every machine: no fast-math, no fused
multiply-add contraction (compilers contract a*b + c by default on some targets), IEEE
semantics for every operation. Cython is fetched by pip as a build requirement.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

DETERMINISTIC = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-unsafe-math-optimizations"]

setup(
    ext_modules=cythonize(
        [
            Extension(
                f"tsi_core.{name}",
                [f"tsi_core/{name}.pyx"],
                include_dirs=["tsi_core"],
                extra_compile_args=DETERMINISTIC,
            )
            for name in ("_kernel", "_bandit")
        ],
        compiler_directives={"language_level": "3"},
    )
)
