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

# ROARMQ_NO_EXTENSIONS=1: import the Python source even where setup.py compiled the same
# module (as aiohttp's AIOHTTP_NO_EXTENSIONS), to compare the two or to step through the
# source; `make test` runs the codec's and the AMQP clients' tests this way too. In a
# checkout a compiled module older than its source is stale (the source was edited, or
# another revision checked out, since `make install` compiled it): the source is imported.
NO_EXTENSIONS = bool(_os.environ.get("ROARMQ_NO_EXTENSIONS"))
_CHECKOUT = _root in __path__  # noqa: F821


class _SourceFirst:
    """Finds a ``roarmq.*`` module by its ``.py`` file when a compiled one must not be used."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if path is None or not name.startswith("roarmq."):
            return None
        leaf = name.rpartition(".")[2]
        for entry in path:
            source = _os.path.join(entry, leaf + ".py")
            if not _os.path.isfile(source):
                continue
            if not NO_EXTENSIONS:
                from importlib.machinery import EXTENSION_SUFFIXES

                built = [_os.path.join(entry, leaf + s) for s in EXTENSION_SUFFIXES]
                built = [b for b in built if _os.path.isfile(b)]
                if not built or _os.path.getmtime(built[0]) >= _os.path.getmtime(source):
                    return None  # the usual import: the compiled module if there is one
                import warnings

                warnings.warn(
                    f"{built[0]} is older than {source}: importing the source "
                    "(`make install` compiles it again)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            from importlib.util import spec_from_file_location

            return spec_from_file_location(name, source)
        return None


if NO_EXTENSIONS or _CHECKOUT:
    import sys as _sys

    _sys.meta_path.insert(0, _SourceFirst)


def compiled_modules() -> list[str]:
    """The ``roarmq`` modules imported so far that run compiled (setup.py's extensions)."""
    import sys
    from importlib.machinery import EXTENSION_SUFFIXES

    suffixes = tuple(EXTENSION_SUFFIXES)
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("roarmq.")
        and str(getattr(module, "__file__", "") or "").endswith(suffixes)
    )
