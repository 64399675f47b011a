"""Build the optional C accelerators; everything else is declared in pyproject.toml.

``proxy.records._ckernels`` (record walking) needs the xxHash header (Debian/Ubuntu:
``apt-get install libxxhash-dev``); ``proxy.commits._cpacked`` (range commits) needs
nothing but a C compiler. Both are optional: one that cannot be built is replaced by its
pure-Python kernels with identical results, only slower. ``make venv`` builds them in
place (through ``pip install -e``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "proxy.records._ckernels",
            sources=["proxy/records/_ckernels.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "proxy.net._cpump",
            sources=["proxy/net/_cpump.c"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "proxy.commits._cpacked",
            sources=["proxy/commits/_cpacked.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
    ]
)
