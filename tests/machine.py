"""What a test needs from the machine, and one rule for when it is absent.

A test that needs a program the machine lacks skips and says why, except where `make test`
should have provided it: there the absence is our own failure (the Makefile's) and the test
fails instead, so that a skip never hides it. The Makefile says what it provides through the
environment (see its `test` target):

* ``ROARMQ_EXPECT_TOOLS``: apt-get and dpkg-deb are here, so `make tools` extracts etcd,
  prometheus and rabbitmqadmin from Debian's packages;
* ``ROARMQ_EXPECT_PACKAGES``: root and apt-get, so `make system-deps` installs amqp-tools, a
  Java runtime, chromium with its driver and fuse3;
* ``ROARMQ_EXPECT_NODE``: npm is here, so `make node-deps` installs amqplib;
* ``ROARMQ_EXPECT_FUSE``: root, and /dev/fuse is here, so FUSE filesystems mount
  (tests/support/powerloss.py);
* ``ROARMQ_EXPECT_ROOT``: `make test` runs as root, so a test may mount a small tmpfs (a
  real full disk);
* ``ROARMQ_EXPECT_COMPILED``: a C compiler is here, so `make install` compiles the message
  path.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(why: str, provided_by: str) -> NoReturn:
    """Skip, saying `why`; fail instead when the environment variable `provided_by` says that
    `make test` provides what is missing."""
    if os.environ.get(provided_by):
        pytest.fail(f"{why} ({provided_by} is set: `make test` should have provided it)")
    pytest.skip(why)
