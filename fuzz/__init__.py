"""Coverage-guided fuzzing of every parser that reads bytes the proxy did not write.

Each target in ``fuzz.targets`` exposes ``one_input(data: bytes)``: it hands the bytes to
the product's parser and lets through only the errors that parser documents for bad
input, so any other exception is a finding. The targets never import atheris: the unit
test ``tests/unit/test_fuzz_corpus.py`` replays the committed corpus and every saved crash
through them with a plain interpreter, and atheris stays an optional extra (``.[fuzz]``).

``python -m fuzz run TARGET`` fuzzes one target under atheris, ``python -m fuzz all`` each
in turn, ``python -m fuzz seed`` rebuilds ``fuzz/corpus`` from the golden traffic.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"
CRASHES = ROOT / "crashes"
DICTIONARIES = ROOT / "dicts"  # libFuzzer token lists, for the targets that have one
# Crashes found and reported but not fixed yet: "target/file exception-class description".
OPEN_CRASHES = CRASHES / "open.txt"

# Target name -> what it covers. The module is ``fuzz.targets.<name>``; this table is read
# before any ``proxy`` module is imported, so that the runner can instrument them all.
TARGETS: dict[str, str] = {
    "frames": "FrameSplitter on chunked streams, request header peeks and their tagged-field limit, Produce acks, the native relay's request classes, the Fetch response walk and its tail rewrite",
    "messages": "the schema codecs of every API key and version the proxy decodes, requests and responses",
    "records": "record batches of every magic, codec, control and transactional flag; compression both ways",
    "split": "split_records, match_offsets and filter_by_offsets with the Python and C kernels side by side",
    "commit_log": "individual-commit log keys and values, the state table, share-watermark metadata, the packed-range kernels",
    "commit_wire": "OffsetCommit v8+ requests and responses read and rewritten from slices",
    "sasl": "SaslHandshake and SaslAuthenticate frames before authentication, through the feature chain",
    "config": "the properties parser, --override entries and the settings checks",
}


class UnknownTarget(KeyError):
    """A target name that ``TARGETS`` lacks."""

    def __str__(self) -> str:
        return f"unknown fuzz target {self.args[0]!r}; known targets: {', '.join(TARGETS)}"


def load_target(name: str) -> ModuleType:
    """The target's module; importing it imports the proxy modules it exercises."""
    if name not in TARGETS:
        raise UnknownTarget(name)
    return importlib.import_module(f"fuzz.targets.{name}")


def open_crashes() -> dict[str, str]:
    """``target/file`` -> the exception class its replay raises while its bug is open."""
    if not OPEN_CRASHES.is_file():
        return {}
    listed = {}
    for line in OPEN_CRASHES.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            path, exception = line.split()[:2]
            listed[path] = exception
    return listed
