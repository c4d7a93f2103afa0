"""Tests of the ``pad`` codec (zfuse.ext.pad), through real zarr arrays on disk."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import struct
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import tifffile
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import BytesCodec, GzipCodec, ZstdCodec
from zarr.core.array_spec import ArrayConfig, ArraySpec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.dtype import UInt8
from zarr.storage import LocalStore

from zfuse.errors import CorruptDataError, MetadataError
from zfuse.ext.pad import PadCodec

# Example 1 of the seed: a 110-byte little-endian TIFF header for one 256x256 uint16 strip.
TIFF_HEADER_B64 = (
    "SUkqAAgAAAAIAAABAwABAAAAAAEAAAEBAwABAAAAAAEAAAIBAwABAAAAEAAAAAMBAwABAAAAAQAAAAYBAwAB"
    "AAAAAQAAABEBBAABAAAAbgAAABYBAwABAAAAAAEAABcBBAABAAAAAAACAAAAAAA="
)

SPEC = ArraySpec(
    shape=(1,),
    dtype=UInt8(),
    fill_value=0,
    config=ArrayConfig.from_dict({}),
    prototype=default_buffer_prototype(),
)


def encode(codec: PadCodec, data: bytes) -> bytes:
    buf = default_buffer_prototype().buffer.from_bytes(data)
    out = codec._encode_sync(buf, SPEC)
    assert out is not None
    return out.to_bytes()


def decode(codec: PadCodec, data: bytes) -> bytes:
    buf = default_buffer_prototype().buffer.from_bytes(data)
    return codec._decode_sync(buf, SPEC).to_bytes()


def chunk_files(root: Path) -> dict[str, bytes]:
    """Every stored chunk (anything but zarr.json), keyed by its path relative to root."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "zarr.json"
    }


# --- metadata ----------------------------------------------------------------------


def test_to_dict_from_dict_round_trip_with_padding() -> None:
    codec = PadCodec(location="start", nbytes=3, padding=b"abc")
    d = codec.to_dict()
    assert d == {
        "name": "pad",
        "configuration": {"location": "start", "nbytes": 3, "padding": "YWJj"},
    }
    assert PadCodec.from_dict(d) == codec
    # The JSON must survive an actual JSON round trip (no bytes leak into it).
    assert PadCodec.from_dict(json.loads(json.dumps(d))) == codec


def test_to_dict_omits_absent_padding_and_padding_func() -> None:
    codec = PadCodec(location="end", nbytes=5, padding_func=lambda b: bytes(5))
    d = codec.to_dict()
    assert d == {"name": "pad", "configuration": {"location": "end", "nbytes": 5}}
    back = PadCodec.from_dict(d)
    assert back.padding is None and back.padding_func is None
    assert back.padding_bytes == bytes(5)


def test_base64_and_raw_bytes_padding_are_equivalent() -> None:
    raw = base64.b64decode(TIFF_HEADER_B64)
    assert len(raw) == 110
    a = PadCodec(location="start", nbytes=110, padding=TIFF_HEADER_B64)
    b = PadCodec(location="start", nbytes=110, padding=raw)
    assert a == b
    assert a.to_dict()["configuration"]["padding"] == TIFF_HEADER_B64  # type: ignore[index]


def test_resolved_through_zarr_registry() -> None:
    from zarr.registry import get_codec_class

    assert get_codec_class("pad") is PadCodec


def test_compute_encoded_size() -> None:
    assert PadCodec(location="start", nbytes=12).compute_encoded_size(100, SPEC) == 112


# --- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"location": "middle", "nbytes": 1}, "location"),
        ({"location": None, "nbytes": 1}, "location"),
        ({"location": "start", "nbytes": -1}, "nbytes"),
        ({"location": "start", "nbytes": 1.5}, "nbytes"),
        ({"location": "start", "nbytes": "4"}, "nbytes"),
        ({"location": "start", "nbytes": True}, "nbytes"),
        ({"location": "start", "nbytes": 4, "padding": "YWJj"}, "padding"),  # 3 bytes
        ({"location": "start", "nbytes": 3, "padding": "not base64!"}, "padding"),
        ({"location": "start", "nbytes": 3, "padding": "YWJ"}, "padding"),  # bad length
        ({"location": "start", "nbytes": 2, "padding": b"abc"}, "padding"),
        ({"location": "start", "nbytes": 2, "padding": 12}, "padding"),
        ({"location": "start", "nbytes": 2, "padding_func": "nope"}, "padding_func"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(MetadataError, match=field) as info:
        PadCodec(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    bad = kwargs[field]
    # The message names the offending value too.
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"name": "pad"}, "configuration"),
        ({"name": "pad", "configuration": {"nbytes": 1}}, "location"),
        ({"name": "pad", "configuration": {"location": "end"}}, "nbytes"),
        ({"name": "pad", "configuration": {"location": "end", "nbytes": 1, "pad": 1}}, "pad"),
        (
            {"name": "pad", "configuration": {"location": "end", "nbytes": 3, "padding": [1]}},
            "padding",
        ),
        ({"name": "gzip", "configuration": {"location": "end", "nbytes": 1}}, "name"),
    ],
)
def test_bad_dicts(data: dict[str, object], match: str) -> None:
    with pytest.raises(MetadataError, match=match):
        PadCodec.from_dict(data)  # type: ignore[arg-type]


def test_bad_metadata_rejected_when_opening_array(tmp_path: Path) -> None:
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [4],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
        "chunk_key_encoding": {"name": "default"},
        "codecs": [
            {"name": "bytes"},
            {"name": "pad", "configuration": {"location": "start", "nbytes": 4, "padding": "YWJj"}},
        ],
        "fill_value": 0,
    }
    (tmp_path / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(MetadataError, match="padding"):
        zarr.open_array(LocalStore(tmp_path))


def test_decode_shorter_than_nbytes_raises() -> None:
    codec = PadCodec(location="start", nbytes=8)
    with pytest.raises(CorruptDataError, match="shorter than the 8 bytes"):
        decode(codec, b"1234567")
    assert decode(codec, b"12345678") == b""


def test_short_chunk_on_disk_raises_on_read(tmp_path: Path) -> None:
    arr = zarr.create_array(
        store=LocalStore(tmp_path),
        shape=(4,),
        chunks=(4,),
        dtype="uint8",
        serializer=BytesCodec(),
        compressors=[PadCodec(location="end", nbytes=16)],
    )
    arr[:] = 1
    (tmp_path / "c" / "0").write_bytes(b"tiny")
    with pytest.raises(CorruptDataError, match="4 bytes, shorter than the 16 bytes"):
        arr[:]


@pytest.mark.parametrize("ret", [b"", b"toolong!!", "text", None])
def test_padding_func_wrong_result_raises(ret: object) -> None:
    codec = PadCodec(location="start", nbytes=8, padding_func=lambda b: ret)  # type: ignore[arg-type,return-value]
    with pytest.raises(MetadataError, match="padding_func"):
        encode(codec, b"data")


def test_padding_func_wrong_length_raises_through_array(tmp_path: Path) -> None:
    arr = zarr.create_array(
        store=LocalStore(tmp_path),
        shape=(4,),
        chunks=(4,),
        dtype="uint8",
        serializer=BytesCodec(),
        compressors=[PadCodec(location="start", nbytes=8, padding_func=lambda b: b"x" * 7)],
    )
    with pytest.raises(MetadataError, match="exactly nbytes=8 bytes, returned 7"):
        arr[:] = 3
    assert chunk_files(tmp_path) == {}


# --- encode / decode ---------------------------------------------------------------


def test_encode_decode_start_and_end() -> None:
    start = PadCodec(location="start", nbytes=2, padding=b"HH")
    end = PadCodec(location="end", nbytes=2, padding=b"TT")
    assert encode(start, b"data") == b"HHdata"
    assert encode(end, b"data") == b"dataTT"
    assert decode(start, b"HHdata") == b"data"
    assert decode(end, b"dataTT") == b"data"
    # Decoding ignores the padding's content (it may be a foreign header).
    assert decode(start, b"xxdata") == b"data"
    assert encode(PadCodec(location="end", nbytes=3), b"d") == b"d\x00\x00\x00"


def test_async_batch_api() -> None:
    codec = PadCodec(location="start", nbytes=1, padding=b"!")
    proto = default_buffer_prototype()

    async def run() -> tuple[list[bytes | None], list[bytes | None]]:
        encoded = list(await codec.encode([(proto.buffer.from_bytes(b"ab"), SPEC), (None, SPEC)]))
        decoded = list(await codec.decode([(encoded[0], SPEC), (None, SPEC)]))
        return (
            [e.to_bytes() if e is not None else None for e in encoded],
            [d.to_bytes() if d is not None else None for d in decoded],
        )

    assert asyncio.run(run()) == ([b"!ab", None], [b"ab", None])


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=300),
    nbytes=st.integers(min_value=0, max_value=64),
    location=st.sampled_from(["start", "end"]),
    seed=st.randoms(use_true_random=False),
    static=st.booleans(),
)
def test_round_trip_property(
    data: bytes, nbytes: int, location: str, seed: object, static: bool
) -> None:
    padding = bytes(seed.randrange(256) for _ in range(nbytes)) if static else None  # type: ignore[attr-defined]
    codec = PadCodec(location=location, nbytes=nbytes, padding=padding)
    enc = encode(codec, data)
    assert len(enc) == len(data) + nbytes == codec.compute_encoded_size(len(data), SPEC)
    pad = padding if padding is not None else bytes(nbytes)
    assert enc == (pad + data if location == "start" else data + pad)
    assert decode(codec, enc) == data
    assert PadCodec.from_dict(json.loads(json.dumps(codec.to_dict()))) == codec


# --- through zarr arrays on a LocalStore ---------------------------------------------


def test_array_pad_start_stored_bytes(tmp_path: Path) -> None:
    data = np.arange(64, dtype="<u2").reshape(8, 8)
    arr = zarr.create_array(
        store=LocalStore(tmp_path),
        shape=data.shape,
        chunks=(4, 4),
        dtype="<u2",
        serializer=BytesCodec(endian="little"),
        compressors=[PadCodec(location="start", nbytes=6, padding=b"HEADER")],
        fill_value=0,
    )
    arr[:] = data
    files = chunk_files(tmp_path)
    assert sorted(files) == ["c/0/0", "c/0/1", "c/1/0", "c/1/1"]
    for key, raw in files.items():
        i, j = map(int, key.split("/")[1:])
        assert len(raw) == 6 + 4 * 4 * 2
        assert raw[:6] == b"HEADER"
        assert raw[6:] == data[4 * i : 4 * i + 4, 4 * j : 4 * j + 4].tobytes()
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path))[:], data)
    # Partial writes decode the stored chunk, merge, then re-encode.
    arr2 = zarr.open_array(LocalStore(tmp_path), mode="r+")
    arr2[1, 1] = 999
    data[1, 1] = 999
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path))[:], data)
    assert (tmp_path / "c/0/0").read_bytes()[:6] == b"HEADER"


def test_array_pad_end(tmp_path: Path) -> None:
    data = np.arange(10, dtype="u1")
    # zarr.create (not create_array) takes a whole `codecs` list.
    arr = zarr.create(
        store=LocalStore(tmp_path),
        shape=(10,),
        chunks=(5,),
        dtype="u1",
        codecs=[BytesCodec(), PadCodec(location="end", nbytes=4, padding=b"TAIL")],
    )
    arr[:] = data
    files = chunk_files(tmp_path)
    assert files == {"c/0": bytes(range(5)) + b"TAIL", "c/1": bytes(range(5, 10)) + b"TAIL"}
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path))[:], data)


def test_array_pad_twice_start_and_end(tmp_path: Path) -> None:
    data = np.arange(1, 9, dtype="u1")
    arr = zarr.create_array(
        store=LocalStore(tmp_path),
        shape=(8,),
        chunks=(8,),
        dtype="u1",
        serializer=BytesCodec(),
        compressors=[
            PadCodec(location="start", nbytes=4, padding=b"HEAD"),
            PadCodec(location="end", nbytes=4, padding=b"TAIL"),
        ],
    )
    arr[:] = data
    assert chunk_files(tmp_path) == {"c/0": b"HEAD" + data.tobytes() + b"TAIL"}
    reopened = zarr.open_array(LocalStore(tmp_path))
    assert [c.to_dict()["name"] for c in reopened.metadata.codecs] == ["bytes", "pad", "pad"]
    np.testing.assert_array_equal(reopened[:], data)


def test_seed_example_1_chunks_are_tiff_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 65535, size=(512, 256), dtype="<u2")
    arr = zarr.create(
        store=LocalStore(tmp_path),
        shape=data.shape,
        chunks=(256, 256),
        dtype="uint16",
        codecs=[
            {"name": "bytes", "configuration": {"endian": "little"}},
            {
                "name": "pad",
                "configuration": {"location": "start", "nbytes": 110, "padding": TIFF_HEADER_B64},
            },
        ],
    )
    arr[:] = data
    header = base64.b64decode(TIFF_HEADER_B64)
    files = chunk_files(tmp_path)
    assert sorted(files) == ["c/0/0", "c/1/0"]
    for key, raw in files.items():
        i = int(key.split("/")[1])
        assert len(raw) == 110 + 256 * 256 * 2
        assert raw.startswith(header)
        expected = data[256 * i : 256 * (i + 1)]
        np.testing.assert_array_equal(tifffile.imread(tmp_path / key), expected)
    meta = json.loads((tmp_path / "zarr.json").read_text())
    assert meta["codecs"][1]["configuration"]["padding"] == TIFF_HEADER_B64
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path))[:], data)


def test_seed_example_2_gzip_then_custom_header(tmp_path: Path) -> None:
    data = np.tile(np.arange(16, dtype="<i4"), 8)
    arr = zarr.create_array(
        store=LocalStore(tmp_path),
        shape=data.shape,
        chunks=(64,),
        dtype="<i4",
        serializer=BytesCodec(endian="little"),
        compressors=[
            GzipCodec(),
            PadCodec.from_dict(
                {
                    "name": "pad",
                    "configuration": {
                        "location": "start",
                        "nbytes": 16,
                        "padding": "TVlfQ1VTVE9NX0hFQURFUg==",
                    },
                }
            ),
        ],
    )
    arr[:] = data
    for key, raw in chunk_files(tmp_path).items():
        assert raw[:16] == b"MY_CUSTOM_HEADER"
        i = int(key.split("/")[1])
        assert gzip.decompress(raw[16:]) == data[64 * i : 64 * (i + 1)].tobytes()
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path))[:], data)


def n5_header(*block_shape: int) -> bytes:
    # N5 default mode: uint16 mode, uint16 ndim, then uint32 per dimension, all big-endian.
    return struct.pack(f">HH{len(block_shape)}I", 0, len(block_shape), *block_shape)


def test_seed_example_3_reads_n5_like_chunks(tmp_path: Path) -> None:
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [1024, 1024],
        "data_type": "uint16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [64, 64]}},
        "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "/"}},
        "codecs": [
            {"name": "bytes", "configuration": {"endian": "big"}},
            # The seed writes {"name": "zstd"}, but zarr-python 3.1.6 insists on a configuration.
            {"name": "zstd", "configuration": {"level": 3, "checksum": False}},
            {"name": "pad", "configuration": {"location": "start", "nbytes": 12}},
        ],
        "fill_value": 0,
    }
    (tmp_path / "zarr.json").write_text(json.dumps(meta))
    header = n5_header(64, 64)
    assert header == b"\x00\x00\x00\x02\x00\x00\x00\x40\x00\x00\x00\x40"
    block = (np.arange(64 * 64, dtype=">u2").reshape(64, 64) * 7).astype(">u2")
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "1").write_bytes(header + numcodecs.Zstd(level=3).encode(block.tobytes()))

    arr = zarr.open_array(LocalStore(tmp_path), mode="r+")
    np.testing.assert_array_equal(arr[0:64, 64:128], block)
    assert arr[:64, :64].max() == 0  # missing chunk: fill value
    assert arr.dtype == np.dtype("uint16")

    # Writing back through zarr: zero padding (no 'padding' given) + zstd of big-endian data.
    arr[0:64, 0:64] = 5
    raw = (tmp_path / "0" / "0").read_bytes()
    assert raw[:12] == bytes(12)
    assert numcodecs.Zstd().decode(raw[12:]) == np.full((64, 64), 5, dtype=">u2").tobytes()
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path))[0:64, 0:128].min(), 0)
    np.testing.assert_array_equal(
        zarr.open_array(LocalStore(tmp_path))[0:64, 0:64], np.full((64, 64), 5)
    )


def test_dynamic_padding_records_compressed_size(tmp_path: Path) -> None:
    seen: list[int] = []

    def size_header(chunk: bytes) -> bytes:
        seen.append(len(chunk))
        return b"ZF" + struct.pack("<Q", len(chunk))

    rng = np.random.default_rng(1)
    # Compressibility differs per chunk, so the headers must differ too.
    data = np.concatenate(
        [
            np.zeros(1000, "<u2"),
            rng.integers(0, 50, 1000, dtype="<u2"),
            np.arange(1000, dtype="<u2"),
        ]
    )
    codec = PadCodec(location="start", nbytes=10, padding_func=size_header)
    arr = zarr.create_array(
        store=LocalStore(tmp_path),
        shape=data.shape,
        chunks=(1000,),
        dtype="<u2",
        serializer=BytesCodec(endian="little"),
        compressors=[GzipCodec(level=5), codec],
        fill_value=7,  # so the all-zero chunk is still written
    )
    arr[:] = data
    files = chunk_files(tmp_path)
    assert sorted(files) == ["c/0", "c/1", "c/2"]
    sizes = set()
    for key, raw in files.items():
        i = int(key.split("/")[1])
        assert raw[:2] == b"ZF"
        (n,) = struct.unpack("<Q", raw[2:10])
        assert n == len(raw) - 10
        sizes.add(n)
        assert gzip.decompress(raw[10:]) == data[1000 * i : 1000 * (i + 1)].tobytes()
    assert len(sizes) == 3
    assert sorted(seen) == sorted(sizes)
    # The callable is not part of the metadata; a plain reader just skips the header.
    meta = json.loads((tmp_path / "zarr.json").read_text())
    assert meta["codecs"][-1] == {
        "name": "pad",
        "configuration": {"location": "start", "nbytes": 10},
    }
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path))[:], data)


def test_zstd_pad_end_with_sharding(tmp_path: Path) -> None:
    # Inside a shard the pad codec wraps each inner chunk; compute_encoded_size is used
    # for the shard index codecs, so exercise both places.
    data = np.arange(256, dtype="<u4").reshape(16, 16)
    arr = zarr.create_array(
        store=LocalStore(tmp_path),
        shape=data.shape,
        chunks=(4, 4),
        shards=(8, 8),
        dtype="<u4",
        serializer=BytesCodec(),
        compressors=[ZstdCodec(), PadCodec(location="end", nbytes=3, padding=b"END")],
    )
    arr[:] = data
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path))[:], data)
    assert len(chunk_files(tmp_path)) == 4
