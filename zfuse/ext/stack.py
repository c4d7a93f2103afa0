"""Building an array's transformer stack from its ``storage_transformers`` list.

Invariants
----------
* Transformers stack in list order: ``storage_transformers[0]`` is nearest the
  array, the last one nearest the store.  Each layer is a
  :class:`~zfuse.ext.layers.ChunkIO` whose keys are relative to the array's
  directory (``"c/0/0"``).
* Unknown transformer names or types raise :class:`zfuse.errors.MetadataError`
  naming them, when the metadata is read (before any chunk is touched).
"""

from __future__ import annotations

from typing import Any

from zfuse.errors import MetadataError
from zfuse.ext.chunk_keys import chunk_key_encoding_of
from zfuse.ext.concat_parts import ConcatPartsIO, parse_concat_parts
from zfuse.ext.layers import ChunkIO
from zfuse.ext.sharding_v1 import ShardingV1IO, parse_sharding_v1

__all__ = ["build_stack", "is_transformed_array", "transformer_kind"]

SHARDING_V1_URIS = frozenset(
    {
        "https://purl.org/zarr/spec/storage_transformers/sharding/1.0",
        # the seed's own (draft) spelling of the URI
        "http://purl.org/zarr/spec/storage-transformers/sharding/1.0",
    }
)
CONCAT_PARTS_NAME = "concat-parts"


def transformer_kind(doc: object, index: int) -> str:
    """``"sharding_v1"`` or ``"concat-parts"``; MetadataError for anything else."""
    field = f"storage_transformers[{index}]"
    if not isinstance(doc, dict):
        raise MetadataError(f"{field} must be an object, got {doc!r}")
    name = doc.get("name", doc.get("extension"))
    if doc.get("extension") in SHARDING_V1_URIS or name in SHARDING_V1_URIS or name == "sharding":
        return "sharding_v1"
    if name == CONCAT_PARTS_NAME:
        return "concat-parts"
    raise MetadataError(
        f"{field}: unknown storage transformer {name!r} "
        f"(zfuse knows 'concat-parts' and sharding v1 "
        f"'https://purl.org/zarr/spec/storage_transformers/sharding/1.0' / 'sharding')"
    )


def build_stack(
    transformers: list[dict[str, Any]],
    metadata: dict[str, Any],
    base: ChunkIO,
    *,
    for_writing: bool = False,
) -> ChunkIO:
    """Wrap ``base`` in one layer per transformer; the returned layer is nearest the array.

    Raises MetadataError for unknown/ill-configured transformers.  With
    ``for_writing`` also refuses configurations that can only be read (a
    concat-parts list with more than one unsized part).
    """
    if not isinstance(transformers, list | tuple):
        raise MetadataError(f"storage_transformers must be a list, got {transformers!r}")
    shape = metadata.get("shape")
    if not isinstance(shape, list | tuple):
        raise MetadataError(f"shape must be a list, got {shape!r}")
    rank = len(shape)
    kinds = [transformer_kind(t, i) for i, t in enumerate(transformers)]
    # concat-parts turns a chunk key into part keys that are no longer chunk keys, so a
    # sharding layer below it (later in the list) would have nothing it can decode.
    for i, kind in enumerate(kinds):
        if kind == "sharding_v1" and "concat-parts" in kinds[:i]:
            raise MetadataError(
                f"storage_transformers[{i}]: sharding v1 cannot sit below concat-parts "
                f"(storage_transformers[{kinds.index('concat-parts')}]); list sharding first"
            )
    encoding = chunk_key_encoding_of(metadata) if "sharding_v1" in kinds else None
    io = base
    for i in reversed(range(len(transformers))):
        doc, kind = transformers[i], kinds[i]
        if kind == "concat-parts":
            cfg = parse_concat_parts(doc, field=f"storage_transformers[{i}]")
            if for_writing:
                cfg.check_writable()
            io = ConcatPartsIO(io, cfg)
        else:
            assert encoding is not None
            cps = parse_sharding_v1(doc, rank, field=f"storage_transformers[{i}]")
            io = ShardingV1IO(io, cps, encoding)
    return io


def is_transformed_array(doc: object) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("node_type") == "array"
        and bool(doc.get("storage_transformers"))
    )
