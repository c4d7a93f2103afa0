"""Tests of the ``suffix`` chunk key encoding (zfuse.ext.suffix), through real arrays."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr
from hypothesis import given
from hypothesis import strategies as st
from zarr.codecs import BytesCodec
from zarr.core.chunk_key_encodings import (
    DefaultChunkKeyEncoding,
    V2ChunkKeyEncoding,
    parse_chunk_key_encoding,
)
from zarr.registry import get_chunk_key_encoding_class
from zarr.storage import LocalStore

from zfuse.errors import MetadataError
from zfuse.ext.pad import PadCodec
from zfuse.ext.suffix import SuffixChunkKeyEncoding

TIFF_HEADER_B64 = (
    "SUkqAAgAAAAIAAABAwABAAAAAAEAAAEBAwABAAAAAAEAAAIBAwABAAAAEAAAAAMBAwABAAAAAQAAAAYBAwAB"
    "AAAAAQAAABEBBAABAAAAbgAAABYBAwABAAAAAAEAABcBBAABAAAAAAACAAAAAAA="
)


def stored_files(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and p.name != "zarr.json"
    )


# --- encoding logic and metadata ----------------------------------------------------


def test_default_base() -> None:
    enc = SuffixChunkKeyEncoding.from_dict({"name": "suffix", "configuration": {"suffix": ".tiff"}})
    assert enc.base_encoding == DefaultChunkKeyEncoding(separator="/")
    assert enc.encode_chunk_key((1, 2)) == "c/1/2.tiff"
    assert enc.decode_chunk_key("c/1/2.tiff") == (1, 2)
    assert enc.encode_chunk_key(()) == "c.tiff"
    assert enc.decode_chunk_key("c.tiff") == ()


@pytest.mark.parametrize("key", ["base-encoding", "base_encoding"])
@pytest.mark.parametrize(
    ("separator", "expected"), [("/", "1/2.shard.zip"), (".", "1.2.shard.zip")]
)
def test_v2_base_either_spelling(key: str, separator: str, expected: str) -> None:
    data = {
        "name": "suffix",
        "configuration": {
            "suffix": ".shard.zip",
            key: {"name": "v2", "configuration": {"separator": separator}},
        },
    }
    enc = SuffixChunkKeyEncoding.from_dict(data)  # type: ignore[arg-type]
    assert enc.base_encoding == V2ChunkKeyEncoding(separator=separator)  # type: ignore[arg-type]
    assert enc.encode_chunk_key((1, 2)) == expected
    assert enc.decode_chunk_key(expected) == (1, 2)
    # Always written with the underscore spelling.
    assert enc.to_dict() == {
        "name": "suffix",
        "configuration": {
            "suffix": ".shard.zip",
            "base_encoding": {"name": "v2", "configuration": {"separator": separator}},
        },
    }


def test_seed_example_2_v2_without_configuration() -> None:
    enc = SuffixChunkKeyEncoding.from_dict(
        {
            "name": "suffix",
            "configuration": {"suffix": ".shard.zip", "base-encoding": {"name": "v2"}},
        }
    )
    assert enc.encode_chunk_key((3, 4)) == "3.4.shard.zip"
    assert enc.encode_chunk_key(()) == "0.shard.zip"


@pytest.mark.parametrize("separator", ["/", "."])
def test_default_base_separators(separator: str) -> None:
    enc = SuffixChunkKeyEncoding(
        suffix=".bin", base_encoding={"name": "default", "configuration": {"separator": separator}}
    )
    key = enc.encode_chunk_key((0, 10, 3))
    assert key == separator.join(["c", "0", "10", "3"]) + ".bin"
    assert enc.decode_chunk_key(key) == (0, 10, 3)


def test_constructor_accepts_encoding_objects_and_nesting() -> None:
    inner = SuffixChunkKeyEncoding(suffix=".b", base_encoding=V2ChunkKeyEncoding(separator="/"))
    outer = SuffixChunkKeyEncoding(suffix=".a", base_encoding=inner)
    assert outer.encode_chunk_key((1, 2)) == "1/2.b.a"
    assert outer.decode_chunk_key("1/2.b.a") == (1, 2)
    assert SuffixChunkKeyEncoding.from_dict(json.loads(json.dumps(outer.to_dict()))) == outer


def test_round_trip_and_zarr_parsing() -> None:
    enc = SuffixChunkKeyEncoding(suffix=".tiff")
    d = enc.to_dict()
    assert d == {
        "name": "suffix",
        "configuration": {
            "suffix": ".tiff",
            "base_encoding": {"name": "default", "configuration": {"separator": "/"}},
        },
    }
    assert SuffixChunkKeyEncoding.from_dict(d) == enc
    # The path zarr's metadata parser takes.
    assert get_chunk_key_encoding_class("suffix") is SuffixChunkKeyEncoding
    assert parse_chunk_key_encoding(d) == enc
    assert parse_chunk_key_encoding(enc) is enc


def test_both_spellings_must_agree() -> None:
    same = {"name": "v2", "configuration": {"separator": "/"}}
    enc = SuffixChunkKeyEncoding.from_dict(
        {
            "name": "suffix",
            "configuration": {"suffix": ".x", "base_encoding": same, "base-encoding": same},
        }
    )
    assert enc.base_encoding == V2ChunkKeyEncoding(separator="/")
    with pytest.raises(MetadataError, match="disagree"):
        SuffixChunkKeyEncoding.from_dict(
            {
                "name": "suffix",
                "configuration": {
                    "suffix": ".x",
                    "base_encoding": same,
                    "base-encoding": {"name": "default"},
                },
            }
        )


def test_decode_without_suffix_raises() -> None:
    enc = SuffixChunkKeyEncoding(suffix=".tiff")
    with pytest.raises(ValueError, match=r"'c/1/2\.tif'.*'\.tiff'"):
        enc.decode_chunk_key("c/1/2.tif")


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({}, "suffix"),
        ({"suffix": 3}, "suffix"),
        ({"suffix": ".x", "base_encoding": "v2"}, "base_encoding"),
        ({"suffix": ".x", "base_encoding": {"name": "nope"}}, "base_encoding"),
        (
            {"suffix": ".x", "base-encoding": {"name": "v2", "configuration": {"separator": "-"}}},
            "base_encoding",
        ),
        ({"suffix": ".x", "extra": 1}, "extra"),
    ],
)
def test_bad_configuration(config: dict[str, object], match: str) -> None:
    with pytest.raises(MetadataError, match=match):
        SuffixChunkKeyEncoding.from_dict({"name": "suffix", "configuration": config})  # type: ignore[dict-item]


def test_missing_configuration() -> None:
    with pytest.raises(MetadataError, match="configuration"):
        SuffixChunkKeyEncoding.from_dict({"name": "suffix"})


@given(
    # min_size=1: a v2 scalar key "0" is inherently ambiguous with (0,).
    coords=st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=5).map(tuple),
    suffix=st.text(max_size=8),
    base=st.sampled_from(
        [
            {"name": "default"},
            {"name": "default", "configuration": {"separator": "."}},
            {"name": "v2", "configuration": {"separator": "/"}},
        ]
    ),
)
def test_encode_decode_property(coords: tuple[int, ...], suffix: str, base: dict) -> None:
    try:
        enc = SuffixChunkKeyEncoding(suffix=suffix, base_encoding=base)
    except MetadataError as e:
        # refused only when its keys would hold an empty, '.' or '..' component, a NUL
        # or a backslash [outside-1]
        parts = ("x" + suffix).split("/")
        assert (any(p in ("", ".", "..") for p in parts[1:]) or "\0" in suffix or "\\" in suffix
                or parts[0] in ("x.", "x..")), (suffix, e)
        return
    key = enc.encode_chunk_key(coords)
    assert key.endswith(suffix)
    assert enc.decode_chunk_key(key) == coords


# --- through zarr arrays ------------------------------------------------------------


def test_array_files_on_disk_default_base(tmp_path: Path) -> None:
    data = np.arange(16, dtype="u1").reshape(4, 4)
    arr = zarr.create_array(
        store=LocalStore(tmp_path),
        shape=(4, 4),
        chunks=(2, 2),
        dtype="u1",
        chunk_key_encoding={"name": "suffix", "configuration": {"suffix": ".tiff"}},
    )
    arr[:] = data
    assert stored_files(tmp_path) == ["c/0/0.tiff", "c/0/1.tiff", "c/1/0.tiff", "c/1/1.tiff"]
    meta = json.loads((tmp_path / "zarr.json").read_text())
    assert meta["chunk_key_encoding"] == SuffixChunkKeyEncoding(suffix=".tiff").to_dict()
    reopened = zarr.open_array(LocalStore(tmp_path))
    assert isinstance(reopened.metadata.chunk_key_encoding, SuffixChunkKeyEncoding)
    np.testing.assert_array_equal(reopened[:], data)
    assert reopened.nchunks_initialized == 4


@pytest.mark.parametrize(
    ("key", "separator", "expected"),
    [
        ("base-encoding", "/", ["0/0.bin", "0/1.bin", "1/0.bin", "1/1.bin"]),
        ("base_encoding", ".", ["0.0.bin", "0.1.bin", "1.0.bin", "1.1.bin"]),
    ],
)
def test_array_files_on_disk_v2_base(
    tmp_path: Path, key: str, separator: str, expected: list[str]
) -> None:
    data = np.arange(16, dtype="u1").reshape(4, 4)
    cke = {
        "name": "suffix",
        "configuration": {
            "suffix": ".bin",
            key: {"name": "v2", "configuration": {"separator": separator}},
        },
    }
    arr = zarr.create_array(
        store=LocalStore(tmp_path), shape=(4, 4), chunks=(2, 2), dtype="u1", chunk_key_encoding=cke
    )
    arr[:] = data
    assert stored_files(tmp_path) == expected
    meta = json.loads((tmp_path / "zarr.json").read_text())
    assert "base_encoding" in meta["chunk_key_encoding"]["configuration"]
    assert "base-encoding" not in meta["chunk_key_encoding"]["configuration"]
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path))[:], data)


def test_hand_written_metadata_with_hyphen_spelling_opens(tmp_path: Path) -> None:
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [4],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
        "chunk_key_encoding": {
            "name": "suffix",
            "configuration": {"suffix": ".raw", "base-encoding": {"name": "v2"}},
        },
        "codecs": [{"name": "bytes"}],
        "fill_value": 0,
    }
    (tmp_path / "zarr.json").write_text(json.dumps(meta))
    (tmp_path / "1.raw").write_bytes(b"\x07\x08")
    arr = zarr.open_array(LocalStore(tmp_path))
    np.testing.assert_array_equal(arr[:], [0, 0, 7, 8])


def test_suffix_plus_pad_makes_tiff_files(tmp_path: Path) -> None:
    """The motivating case: chunk files named *.tiff that are TIFF files."""
    data = np.random.default_rng(3).integers(0, 4000, size=(256, 512), dtype="<u2")
    arr = zarr.create_array(
        store=LocalStore(tmp_path),
        shape=data.shape,
        chunks=(256, 256),
        dtype="<u2",
        serializer=BytesCodec(endian="little"),
        compressors=[PadCodec(location="start", nbytes=110, padding=TIFF_HEADER_B64)],
        chunk_key_encoding=SuffixChunkKeyEncoding(suffix=".tiff"),
    )
    arr[:] = data
    assert stored_files(tmp_path) == ["c/0/0.tiff", "c/0/1.tiff"]
    header = base64.b64decode(TIFF_HEADER_B64)
    for j in range(2):
        path = tmp_path / f"c/0/{j}.tiff"
        assert path.read_bytes()[:110] == header
        np.testing.assert_array_equal(tifffile.imread(path), data[:, 256 * j : 256 * (j + 1)])
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path))[:], data)
