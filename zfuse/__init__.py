"""zfuse: every chunk of a Zarr store as a standalone TIFF file, and the Zarr
extensions (pad and packbits codecs, suffix chunk key encoding, concat-parts and sharding-v1
storage transformers) for zarr-python 3.

Public API (imported lazily so that `import zfuse` stays cheap and the codec
entry points zarr-python loads never import the FUSE layer):

- ``open_array(store, mode="r", **create_kwargs)`` / ``open_group(...)``
- ``concat(sources, axis, mode="r")``: a virtual concatenation (``ConcatArray``);
  ``save_concat(path, sources, axis)`` / ``load_concat(path, mode="r")`` write and
  read its description file (what ``zfuse concat`` and ``zfuse mount`` use)
- ``PadCodec``, ``PackBitsCodec``, ``SuffixChunkKeyEncoding``
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "open_array": ("zfuse.ext.api", "open_array"),
    "open_group": ("zfuse.ext.api", "open_group"),
    "concat": ("zfuse.ext.concat", "concat"),
    "save_concat": ("zfuse.ext.concat", "save_concat"),
    "load_concat": ("zfuse.ext.concat", "load_concat"),
    "ConcatArray": ("zfuse.ext.concat", "ConcatArray"),
    "PadCodec": ("zfuse.ext.pad", "PadCodec"),
    "PackBitsCodec": ("zfuse.ext.packbits", "PackBitsCodec"),
    "SuffixChunkKeyEncoding": ("zfuse.ext.suffix", "SuffixChunkKeyEncoding"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'zfuse' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value
