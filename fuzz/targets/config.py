"""The proxy's configuration: a Kafka-style properties file and ``--override`` entries.

An operator's mistake must come back as ``ConfigError``, which the command line turns
into one line naming the key and the problem (``proxy/server/cli.py`` catches nothing
else); any other exception is a traceback at start-up instead of that message. Three ways
in, as the command line has them: properties text, a properties file on disk (read as
UTF-8), and ``--override key=value`` arguments.

Input: a mode byte (0 text, 1 file, 2 overrides, one per line), then the text.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from proxy.server.config import ConfigError, build_config, load_config, parse_properties

_SCRATCH = Path(tempfile.mkdtemp(prefix="fuzz-config-"))
atexit.register(shutil.rmtree, _SCRATCH, True)
_FILE = _SCRATCH / "proxy.properties"


def one_input(data: bytes) -> None:
    if not data:
        return
    mode, rest = data[0] % 3, data[1:]
    try:
        if mode == 0:
            build_config(parse_properties(rest.decode("utf-8", "replace")))
        elif mode == 1:
            _FILE.write_bytes(rest)
            load_config(str(_FILE), [])
        else:
            load_config(None, rest.decode("utf-8", "replace").split("\n"))
    except ConfigError:
        pass
