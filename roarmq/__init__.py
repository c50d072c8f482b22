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
# source; `make test` runs every test not marked slow this way too. In a checkout a compiled
# module older than its source or .pxd is stale (the source was edited, or another revision
# checked out, since `make install` compiled it): the source is imported.
NO_EXTENSIONS = bool(_os.environ.get("ROARMQ_NO_EXTENSIONS"))
_CHECKOUT = _root in __path__  # noqa: F821


#: The modules setup.py compiles, with their sources in the repository. Most have a .pxd
#: beside it declaring its native classes, and those cimport one another (a ContentHeader
#: in a Message in an Entry in a Queue, delivered by a Channel to a Consumer on a
#: Connection): a compiled module checks at import that the classes it cimports are the
#: compiled ones, so these run compiled together or not at all. The topic index and its
#: routing-key cache have none: compiled as they are, a cold route (split, trie walk, cache
#: admission) runs without the interpreter's frames and dispatch (bench/topic_go.py).
COMPILED = {
    "roarmq.protocol.frames": "protocol/frames.py",
    "roarmq.broker.core.message": "broker/core/message.py",
    "roarmq.broker.core.queue": "broker/core/queue.py",
    "roarmq.broker.amqp.channel": "broker/amqp/channel.py",
    "roarmq.broker.amqp.connection": "broker/amqp/connection.py",
    "roarmq.broker.core.exchange": "broker/core/exchange.py",
    "roarmq.broker.routing.graph": "broker/routing/graph.py",
    "roarmq.broker.routing.trie": "broker/routing/trie.py",
    "roarmq.broker.routing.topic": "broker/routing/topic.py",
    "roarmq.broker.routing.key_cache": "broker/routing/key_cache.py",
}


def _built(source):
    """The compiled module beside ``source`` (a .py path), or None."""
    from importlib.machinery import EXTENSION_SUFFIXES

    for suffix in EXTENSION_SUFFIXES:
        built = source[:-3] + suffix
        if _os.path.isfile(built):
            return built
    return None


def _stale(source):
    """Why the compiled module beside ``source`` must not be used (None: it may be)."""
    built = _built(source)
    if built is None:
        return None
    pxd = source[:-3] + ".pxd"
    for origin in (source, pxd):
        if _os.path.isfile(origin) and _os.path.getmtime(built) < _os.path.getmtime(origin):
            return f"{built} is older than {origin}"
    return None


_group_verdict = []  # [reason or None], once computed


def _compiled_group_refused():
    """Why the checkout's compiled modules cannot all be used (None: they can). Built
    partly (some present, some not) counts as refused: the present ones would find the
    others' classes uncompiled."""
    if not _group_verdict:
        sources = [_os.path.join(_root, path) for path in COMPILED.values()]
        built = [s for s in sources if _built(s) is not None]
        reason = None
        if built and len(built) < len(sources):
            missing = sorted(set(sources) - set(built))
            reason = f"{', '.join(missing)} not compiled"
        for source in built:
            reason = reason or _stale(source)
        _group_verdict.append(reason)
    return _group_verdict[0]


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
                if name in COMPILED:  # (installed here only in a checkout)
                    reason = _compiled_group_refused()
                else:
                    reason = _stale(source)
                if reason is None:
                    return None  # the usual import: the compiled module if there is one
                import warnings

                warnings.warn(
                    f"{reason}: importing the source of {name} (`make install` compiles it again)",
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
