"""Build the optional C accelerators; everything else is declared in pyproject.toml.

``proxy.records._ckernels`` (record walking) needs the xxHash header (Debian/Ubuntu:
``apt-get install libxxhash-dev``); ``proxy.commits._cpacked`` (range commits) and
``proxy.net._cpump`` (the native relay) need nothing but a C compiler. All are optional:
a kernel that cannot be built is replaced by its pure-Python reference with identical
results, only slower, and without the native relay every frame goes through the event
loop. ``make venv`` builds them in place (through ``pip install -e``) with
``KEYRANGE_ACCELERATORS=required`` when a C compiler is there: a source that no longer
compiles then fails the build, instead of leaving the previous build in place for the tests.

The native relay's numbers (its table of API keys and versions, the protocol's count
limits) are declared once, in Python (``proxy/net/native_table.py``,
``proxy/protocol/constants.py``); the header its C source includes is written from them
here, before the build.
"""

import os
import runpy
from pathlib import Path

from setuptools import Extension, setup

_ROOT = Path(__file__).resolve().parent


def _write_native_header() -> None:
    table = runpy.run_path(str(_ROOT / "proxy/net/native_table.py"))
    constants = runpy.run_path(str(_ROOT / "proxy/protocol/constants.py"))
    native = table["NativeClass"]
    values = {
        "KEYS": table["KEYS"], "VERSIONS": table["VERSIONS"],
        "CLASS_PYTHON": int(native.PYTHON), "CLASS_OPAQUE": int(native.OPAQUE), "CLASS_PRODUCE": int(native.PRODUCE),
        "CLASS_FETCH": int(native.FETCH),
        "CLASS_FLEXIBLE_HEADER": table["FLEXIBLE_HEADER"], "CLASS_GUARDED": table["GUARDED"],
        "CLASS_MASK": table["_CLASS_MASK"],
        "MAX_ARRAY_ELEMENTS": constants["MAX_ARRAY_ELEMENTS"], "MAX_TAGGED_FIELDS": constants["MAX_TAGGED_FIELDS"],
    }
    text = "/* Written by setup.py from proxy/net/native_table.py and proxy/protocol/constants.py. */\n"
    text += "".join(f"#define {name} {value}\n" for name, value in values.items())
    header = _ROOT / "proxy/net/_native_table.h"
    if not header.exists() or header.read_text() != text:
        header.write_text(text)


_write_native_header()
_OPTIONAL = os.environ.get("KEYRANGE_ACCELERATORS", "optional") != "required"

setup(
    ext_modules=[
        Extension(
            "proxy.records._ckernels",
            sources=["proxy/records/_ckernels.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=_OPTIONAL,
        ),
        Extension(
            "proxy.net._cpump",
            sources=["proxy/net/_cpump.c"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=_OPTIONAL,
        ),
        Extension(
            "proxy.commits._cpacked",
            sources=["proxy/commits/_cpacked.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=_OPTIONAL,
        ),
    ]
)
