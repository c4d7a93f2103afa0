"""Codec packages: registering the ones the user already has, and naming a broken one.

No zarr or numcodecs import at module level: `import_failure` must work when
``import numcodecs`` itself fails (zarr-python imports it, so then nothing of
zarr can be imported either).

- imagecodecs (a zfuse dependency) ships numcodecs codecs (PNG, JPEG,
  JPEG 2000, LERC, JPEG XL, ...) but numcodecs only knows them once
  ``imagecodecs.numcodecs.register_codecs()`` ran: without it every array
  zarr-python 2 wrote with them is shown as unreadable. `register_imagecodecs`
  registers them once, when a view is opened. How their chunks are decoded
  within bounds is bounded_decode's business.
- A codec package that raises on import (zfpy 1.0.1.post0: numcodecs parses its
  version as integers and fails with ValueError on "post0") breaks
  ``import numcodecs``, so every store fails with a bare ValueError.
  `import_failure` recognises such an exception and names the package.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import sys
import sysconfig
import traceback

__all__ = ["import_failure", "register_imagecodecs"]

log = logging.getLogger("zfuse.view")


@functools.cache
def register_imagecodecs() -> None:
    """Register imagecodecs' numcodecs codecs with numcodecs (once per process).

    Ids already registered (the user's own ``register_codecs()``, or a plugin with
    the same id) are kept as they are. A failure is logged, never fatal: those
    arrays are then shown as unreadable, naming the codec, as before."""
    try:
        import imagecodecs.numcodecs

        imagecodecs.numcodecs.register_codecs(verbose=False)
    except Exception as exc:  # an imagecodecs build without its numcodecs module
        log.warning("imagecodecs' numcodecs codecs are not available: %s: %s",
                    type(exc).__name__, exc)


# packages of the import machinery itself, never the culprit
_NOT_CULPRITS = frozenset({"importlib", "zfuse", "zarr", "numcodecs", "<frozen importlib._bootstrap>",
                           "<frozen importlib._bootstrap_external>"})
# known breakages: package -> (versions, what to do)
_KNOWN = {"zfpy": ("1.0.1.post0", "pip uninstall zfpy")}


def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if k in paths)


def _module_of(filename: str) -> str | None:
    """The dotted module a source file is, by the longest sys.path entry it lies under
    (None for the standard library and frozen modules)."""
    if filename.startswith("<"):
        return None
    real = os.path.realpath(filename)
    if real.startswith(_stdlib_dirs()) and "site-packages" not in real:
        return None
    best = ""
    for entry in sys.path:
        root = os.path.realpath(entry or os.getcwd()) + os.sep
        if real.startswith(root) and len(root) > len(best):
            best = root
    if not best:
        return None
    rel = os.path.splitext(real[len(best):])[0].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join(rel) or None


def _frames(exc: BaseException) -> list[str]:
    """The modules of the frames `exc` passed through, outermost first, following
    the exceptions it was raised from or during (an import error re-raised)."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        chain.append(at)
        at = at.__cause__ or at.__context__
    modules: list[str] = []
    for one in reversed(chain):  # the first exception's frames are the deepest cause
        for frame in traceback.extract_tb(one.__traceback__):
            module = _module_of(frame.filename)
            if module is not None:
                modules.append(module)
    return modules


def _importing(exc: BaseException) -> bool:
    """Whether `exc` (or one it was raised from or during) was raised by an import: an
    ImportError, or a module's top-level code running (its "<module>" frame; CPython
    drops the import machinery's own frames). Not numcodecs' registry refusing a codec
    id it does not know (a store's unknown compressor: numcodecs imports fine)."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, ImportError):
            return True
        for frame in traceback.extract_tb(at.__traceback__):
            module = _module_of(frame.filename) if frame.name == "<module>" else None
            if module is not None and module != "__main__" and not module.startswith("zfuse"):
                return True
        at = at.__cause__ or at.__context__
    return False


def import_failure(exc: BaseException) -> str | None:
    """If `exc` was raised while numcodecs (or a codec package it loads) was being
    imported: one line saying so and naming the package the traceback points at;
    else None (the exception is something else, described as before)."""
    modules = _frames(exc)
    if not any(m == "numcodecs" or m.startswith("numcodecs.") for m in modules) or not _importing(exc):
        return None
    culprit = None
    for module in reversed(modules):  # the deepest frame outside numcodecs, zarr and zfuse
        top = module.split(".")[0]
        if top not in _NOT_CULPRITS:
            culprit = top
            break
    if culprit is None:
        # raised in numcodecs' own wrapper of an installed package (numcodecs.zfpy wraps
        # zfpy, and failed reading zfpy's version); numcodecs.registry etc. wrap nothing
        wrapped = [m.split(".")[1] for m in modules if m.startswith("numcodecs.") and m.count(".") == 1]
        culprit = next((name for name in reversed(wrapped) if _version(name) is not None), None)
    text = " ".join(str(exc).split())
    what = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    line = f"numcodecs cannot be imported: {what}"
    if culprit is None:
        return line + " (a broken codec package?)"
    # the distribution (what pip knows) that installs the module
    dist = (importlib.metadata.packages_distributions().get(culprit) or [culprit])[0]
    version = _version(dist)
    named = f"{dist} {version}" if version else dist
    known = _KNOWN.get(dist)
    if known is not None and version == known[0]:
        return (f"{line} (a broken codec package: {named} is known to break numcodecs: "
                f"{known[1]})")
    return (f"{line} (a broken codec package? the error comes from {named}: "
            f"pip uninstall {dist}, or upgrade it)")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except Exception:
        return None
