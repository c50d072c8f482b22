"""Memory of a topic index shaped like bench/topic_go.py's, bound and then routed (tracemalloc).

    .venv/bin/python bench/topic_memory.py [--patterns 100000]
    PYTHONPATH=OTHER_TREE .venv/bin/python bench/topic_memory.py   # another tree's index

(It measures the ``roarmq`` it imports, which it names, not necessarily this tree's.)

``--patterns`` wildcard patterns (``s{i}.*.x`` even i, ``s{i}.#`` odd i) and a hundredth as
many literals, each to a destination of its own, as ``bench/topic_go.py`` binds them; then
every one of as many distinct keys routed twice (each matching one pattern, none cached: ten
times the key cache). Prints the Python heap the index holds after binding and after routing:
what a cold route leaves behind on the pattern ends it reaches.
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

import roarmq
from roarmq.broker.routing import TopicIndex


class Destination:
    __slots__ = ("name",)

    def __init__(self, name: int) -> None:
        self.name = name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--patterns", type=int, default=100_000)
    n = parser.parse_args().patterns
    literals = n // 100
    destinations = [Destination(i) for i in range(n + literals)]
    tracemalloc.start()
    index = TopicIndex()
    for i in range(n):
        index.bind(f"s{i}.*.x" if i % 2 == 0 else f"s{i}.#", destinations[i])
    for i in range(literals):
        index.bind(f"lit{i}", destinations[n + i])
    gc.collect()
    bound = tracemalloc.get_traced_memory()[0]
    for k in range(2):
        for i in range(n):
            index.route(f"s{i}.w{k}.x" if i % 2 == 0 else f"s{i}.w{k}.y")
    gc.collect()
    routed = tracemalloc.get_traced_memory()[0]
    print(f"roarmq from {roarmq.__file__}")
    print(
        f"bound {bound / 1e6:.1f} MB ({bound / (n + literals):.0f} B a binding); "
        f"after routing every key twice {routed / 1e6:.1f} MB (+{(routed - bound) / 1e6:.1f} MB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
