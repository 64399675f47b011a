"""Build the optional C accelerator; everything else is declared in pyproject.toml.

The extension needs the xxHash header (Debian/Ubuntu: ``apt-get install libxxhash-dev``).
It is optional: if it cannot be built, the pure-Python kernels are used with identical
results, only slower. Build in place with ``python setup.py build_ext --inplace``.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "proxy.records._ckernels",
            sources=["proxy/records/_ckernels.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
