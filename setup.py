"""Optional compiled modules: the same Python source, compiled with Cython when it can be.

Everything else about the package is in pyproject.toml. What is compiled, and how, is decided
by measurement (docs/benchmarks.md, "Codec" and "Hot path"): each module
here has a .pxd beside it that declares its classes native (fields as C struct members) and
types the locals of its hot loops, so Cython turns attribute reads and calls between them into
C. Compiled without those declarations the broker's classes ran *more* instructions than
CPython 3.11's specialised interpreter; with them a direct message costs half of what it did.

Nothing here is required: without a C compiler (or with ROARMQ_NO_EXTENSIONS=1 set at
install time) the build skips the extensions and the package is pure Python, and a
compiled module can be bypassed at run time with ROARMQ_NO_EXTENSIONS=1 too
(roarmq/__init__.py), which is how the test suite checks both.
"""

import ast
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext


def compiled() -> dict[str, str]:
    """Module -> source: roarmq/__init__.py's COMPILED, kept there because the run-time
    import rule reads it too (the compiled modules run together or not at all). Read, not
    imported: setup.py runs before the package is importable."""
    with open(os.path.join("roarmq", "__init__.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "COMPILED":
            return ast.literal_eval(node.value)
    raise RuntimeError("roarmq/__init__.py has no COMPILED")


#: Where Cython looks for the .pxd beside each compiled module. It finds a module's .pxd by
#: the module's full name (roarmq/protocol/frames.pxd), while the folders here are named
#: without the roarmq/ prefix (pyproject.toml's package-dir): a folder of links names them so.
PXD_ROOT = os.path.join("build", "cython-include")


def pxd_include() -> str:
    root = os.path.join(PXD_ROOT, "roarmq")
    os.makedirs(root, exist_ok=True)
    for package in ("protocol", "broker"):
        link = os.path.join(root, package)
        if not os.path.islink(link):
            os.symlink(os.path.abspath(package), link)
    return PXD_ROOT


class OptionalBuildExt(build_ext):
    """build_ext that warns and goes on, pure Python, when an extension cannot be built;
    the C compiles run one per core (ten modules: about half the install's time)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no Python headers: fall back, loudly
            print(f"roarmq: not compiling ({exc}); pure Python", file=sys.stderr)

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
    modules = [Extension(name, [path]) for name, path in compiled().items()]
    try:
        return cythonize(
            modules,
            nthreads=os.cpu_count() or 1,
            include_path=[pxd_include()],
            # The .pxd files say what is typed; annotations stay documentation (an `int`
            # annotation would otherwise make Cython insist on an exact Python int).
            compiler_directives={"language_level": 3, "annotation_typing": False},
            quiet=True,
        )
    except Exception as exc:
        print(f"roarmq: Cython failed ({exc}); pure Python", file=sys.stderr)
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
