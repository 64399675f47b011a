"""proxy.protocol.once: a message's classes and codecs are built by one caller, even when
two threads ask for them first at the same moment."""

from __future__ import annotations

import threading

from proxy.protocol.once import built_once


def test_a_second_caller_waits_for_the_first_build_instead_of_building_again():
    started, proceed = threading.Event(), threading.Event()
    builds: list[str] = []

    @built_once
    def build(name: str) -> object:
        builds.append(name)
        started.set()
        proceed.wait(10)
        return object()

    got: list[object] = []
    first = threading.Thread(target=lambda: got.append(build("m")))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=lambda: got.append(build("m")))
    second.start()
    # a second build would show within this deadline; the lock keeps it out
    built_twice = threading.Event()
    for _ in range(50):
        if len(builds) > 1:
            built_twice.set()
            break
        second.join(0.01)
    proceed.set()
    first.join(10)
    second.join(10)
    assert not built_twice.is_set() and builds == ["m"]
    assert len(got) == 2 and got[0] is got[1]
    assert build("m") is got[0] and build(name="n") is not got[0]
