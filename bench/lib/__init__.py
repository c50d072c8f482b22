"""What bench/'s scripts share: brokers, clusters, processes, probes, load, output, machine facts.
Scripts import it (``from lib.brokers import ...``, bench/ first on sys.path); it imports no script.

Importing it checks that ``roarmq`` is this tree's (the benchmarks measure the tree they are
in) and puts ``tests/`` on ``sys.path``, after everything else, so that ``support.*`` (the
project's one ``free_port`` and etcd lookup, the cluster tests' load) is importable.
"""

from __future__ import annotations

import sys
from pathlib import Path

import roarmq

REPO = Path(__file__).resolve().parents[2]
# The benchmarks measure the tree they are in. With another tree's venv (comparing two
# worktrees with one interpreter) the venv's editable install would import the other
# tree's code, silently: say so instead. `PYTHONPATH=TREE` makes a tree's own code win.
if Path(roarmq.__file__).resolve().parent.parent != REPO:
    sys.exit(
        f"bench/ measures {REPO}, but roarmq was imported from {roarmq.__file__}: "
        f"run with PYTHONPATH={REPO}"
    )

RESULTS = REPO / "bench" / "results"  # where every script writes its JSON by default
LOAD = Path(__file__).resolve().with_name("amqp_load.py")  # the load child, run by path

TESTS = str(REPO / "tests")
if TESTS not in sys.path:
    sys.path.append(TESTS)  # last: tests/routing etc. must not shadow anything
