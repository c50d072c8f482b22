"""Optional compiled modules: the same Python source, compiled with Cython when it can be.

Everything else about the package is in pyproject.toml. Which modules are compiled is
decided by measurement (docs/benchmarks.md, "The compiled codec"): with the frame codec
compiled, whose hot loops are plain functions over bytes, a direct message costs 9.6% fewer
instructions; the broker's class-heavy modules (channel, queue) ran *more* instructions
compiled without type declarations, since CPython 3.11's specialised attribute and
method caches beat Cython's generic attribute lookups, so they stay interpreted.

Nothing here is required: without a C compiler (or with ROARMQ_NO_EXTENSIONS=1 set at
install time) the build skips the extension and the package is pure Python, and a
compiled module can be bypassed at run time with ROARMQ_NO_EXTENSIONS=1 too
(roarmq/__init__.py), which is how the test suite checks both.
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED = {"roarmq.protocol.frames": "protocol/frames.py"}


class OptionalBuildExt(build_ext):
    """build_ext that warns and goes on, pure Python, when an extension cannot be built."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no Python headers: fall back, loudly
            print(f"roarmq: not compiling the codec ({exc}); pure Python", file=sys.stderr)

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"roarmq: could not compile {ext.name} ({exc}); pure Python", file=sys.stderr)


def extensions() -> list:
    if os.environ.get("ROARMQ_NO_EXTENSIONS"):
        return []
    try:
        from Cython.Build import cythonize
        from setuptools import Extension
    except ImportError:
        print("roarmq: Cython not available; pure Python", file=sys.stderr)
        return []
    modules = [Extension(name, [path]) for name, path in COMPILED.items()]
    try:
        return cythonize(modules, compiler_directives={"language_level": 3}, quiet=True)
    except Exception as exc:
        print(f"roarmq: Cython failed ({exc}); pure Python", file=sys.stderr)
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
