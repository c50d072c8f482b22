"""RoarMQ: an AMQP 0-9-1 message broker on asyncio + uvloop, with trie + roaring-bitmap routing.

Everything RoarMQ installs lives under this one import name, so nothing can collide with a
user's own `broker` or `pipeline` package:

* `roarmq.broker`   -- the daemon (the repository's `broker/` folder)
* `roarmq.protocol` -- the sans-IO AMQP 0-9-1 codec (`protocol/`)
* `roarmq.pipeline` -- the PySpark jobs over the traffic archive (`pipeline/`)

setuptools maps the folders here (pyproject.toml, `[tool.setuptools] package-dir`).
"""

import os as _os

__version__ = "0.1.0"

# Run from a checkout (not installed, or another revision's tree started with
# `python -m roarmq`): the sub-packages are the repository's folders beside this one.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isfile(
    _os.path.join(_root, "broker", "__init__.py")
):
    __path__.append(_root)  # noqa: F821 - a package's own __path__
