"""The one chunk-key decoder (zfuse.ext.chunk_keys) that every layer uses.

A key decodes iff it round-trips through the encoding at the array's rank; the
fast path (default and v2 encodings) and the general path must agree on that.
"""

from __future__ import annotations

import itertools

import pytest
from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding, V2ChunkKeyEncoding

from zfuse.errors import NotAChunkKeyError
from zfuse.ext.chunk_keys import ChunkKeyDecoder, decode_default_chunk_key
from zfuse.ext.suffix import SuffixChunkKeyEncoding

ENCODINGS = [
    DefaultChunkKeyEncoding(separator="/"),
    DefaultChunkKeyEncoding(separator="."),
    V2ChunkKeyEncoding(separator="."),
    V2ChunkKeyEncoding(separator="/"),
    SuffixChunkKeyEncoding(suffix=".tiff"),
    SuffixChunkKeyEncoding(suffix=".v2", base_encoding={"name": "v2"}),
]


@pytest.mark.parametrize("encoding", ENCODINGS, ids=lambda e: str(e.to_dict()))
@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_every_encoded_key_decodes_back(encoding: object, rank: int) -> None:
    decode = ChunkKeyDecoder(rank, encoding=encoding)  # type: ignore[arg-type]
    # the same answers when only the encode function is known (the general path)
    general = ChunkKeyDecoder(rank, encode=encoding.encode_chunk_key)  # type: ignore[attr-defined]
    for coords in itertools.product([0, 1, 7, 10, 123], repeat=rank):
        key = encoding.encode_chunk_key(coords)  # type: ignore[attr-defined]
        assert decode(key) == coords, key
        assert general(key) == coords, key


@pytest.mark.parametrize(
    ("encoding", "rank", "key"),
    [
        (DefaultChunkKeyEncoding(), 2, "c/01/2"),  # not canonical
        (DefaultChunkKeyEncoding(), 2, "c/1/2/"),
        (DefaultChunkKeyEncoding(), 2, "c/1"),  # other rank
        (DefaultChunkKeyEncoding(), 2, "c/1/2/3"),
        (DefaultChunkKeyEncoding(), 2, "c.1.2"),  # other separator
        (DefaultChunkKeyEncoding(), 2, "c/-1/2"),
        (DefaultChunkKeyEncoding(), 2, "zarr.json"),
        (DefaultChunkKeyEncoding(), 0, "c/0"),
        (V2ChunkKeyEncoding(), 2, "1/2"),
        (V2ChunkKeyEncoding(), 2, "c.1.2"),
        (V2ChunkKeyEncoding(), 0, "c"),
        (SuffixChunkKeyEncoding(suffix=".tiff"), 2, "c/1/2.tif"),
        (SuffixChunkKeyEncoding(suffix=".tiff"), 2, "c/1/2"),
        (SuffixChunkKeyEncoding(suffix=".tiff"), 2, "c/1/02.tiff"),
    ],
)
def test_keys_that_do_not_round_trip_are_not_chunk_keys(encoding: object, rank: int, key: str) -> None:
    assert ChunkKeyDecoder(rank, encoding=encoding)(key) is None  # type: ignore[arg-type]
    assert ChunkKeyDecoder(rank, encode=encoding.encode_chunk_key)(key) is None  # type: ignore[attr-defined]


def test_digits_in_a_suffix_do_not_confuse_the_decoder() -> None:
    enc = SuffixChunkKeyEncoding(suffix=".v2.tiff")
    assert ChunkKeyDecoder(2, encoding=enc)("c/3/4.v2.tiff") == (3, 4)
    assert ChunkKeyDecoder(2, encode=enc.encode_chunk_key)("c/3/4.v2.tiff") == (3, 4)


def test_default_keys_decode_without_zarrs_bug() -> None:
    # zarr 3.1's DefaultChunkKeyEncoding.decode_chunk_key keeps the leading separator
    assert decode_default_chunk_key("c/1/2", "/") == (1, 2)
    assert decode_default_chunk_key("c", "/") == ()
    with pytest.raises(NotAChunkKeyError, match="does not start with"):
        decode_default_chunk_key("1/2", "/")
    with pytest.raises(NotAChunkKeyError, match="not integers"):
        decode_default_chunk_key("c/1/x", "/")
    assert issubclass(NotAChunkKeyError, ValueError)  # what zarr's decode_chunk_key raises


def test_a_decoder_needs_a_way_to_encode() -> None:
    with pytest.raises(TypeError):
        ChunkKeyDecoder(2)
