"""Stored chunks are input too: every compressor zfuse knows decodes into at most the
chunk's bytes (FUSE-free, plain calls). A bomb is refused as corrupt data before it
costs memory; honest streams decode to exactly what numcodecs gives."""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib

import numcodecs
import numpy as np
import pytest
from numcodecs import Blosc

from zfuse.errors import CorruptDataError
from zfuse.view.bounded_decode import bounded, codec_id, decompress_bounded

BIG = 256 * 2**20  # what a bomb holds; the limit is a 64 KiB chunk
LIMIT = 64 * 1024
HONEST = (np.arange(LIMIT, dtype=np.uint32) % 251).astype(np.uint8).tobytes()


def _rss_peak_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError


STREAMS = {
    "zstd": lambda b: numcodecs.Zstd(level=1).encode(b),
    "gzip": lambda b: gzip.compress(b, 1),
    "zlib": lambda b: zlib.compress(b, 1),
    "bz2": lambda b: bz2.compress(b, 1),
    "lzma": lambda b: lzma.compress(b, preset=0),
}


@pytest.mark.parametrize("ident", list(STREAMS))
def test_stream_bombs_are_refused_within_the_limit(ident: str) -> None:
    bomb = STREAMS[ident](bytes(BIG))
    before = _rss_peak_kib()
    with pytest.raises(CorruptDataError):
        decompress_bounded(ident, {}, bomb, LIMIT)
    assert _rss_peak_kib() - before < 64 * 1024, "the refusal grew the process by 64 MiB or more"


@pytest.mark.parametrize("ident", list(STREAMS))
def test_honest_streams_decode_exactly(ident: str) -> None:
    assert bytes(decompress_bounded(ident, {}, STREAMS[ident](HONEST), LIMIT) or b"") == HONEST
    with pytest.raises(CorruptDataError):  # one byte short of a limit it needs
        decompress_bounded(ident, {}, STREAMS[ident](HONEST), LIMIT - 1)


def test_a_multi_member_gzip_stream_decodes_whole() -> None:
    half = len(HONEST) // 2
    data = gzip.compress(HONEST[:half]) + gzip.compress(HONEST[half:])
    assert bytes(decompress_bounded("gzip", {}, data, LIMIT) or b"") == HONEST


def test_two_zstd_frames_are_bounded_together() -> None:
    """Each frame declares a size within the limit; together they exceed it."""
    frame = numcodecs.Zstd(level=1).encode(bytes(LIMIT))
    with pytest.raises(CorruptDataError):
        decompress_bounded("zstd", {}, frame + frame, LIMIT)


@pytest.mark.parametrize("codec", [Blosc(cname="zstd"), numcodecs.LZ4()])
def test_declared_sizes_are_checked_before_decoding(codec: numcodecs.abc.Codec) -> None:
    ident, config = codec_id(codec)
    bomb = codec.encode(np.zeros(4 * LIMIT, np.uint8))
    with pytest.raises(CorruptDataError, match="declares"):
        decompress_bounded(ident or "", config, bomb, LIMIT)
    honest = codec.encode(np.frombuffer(HONEST, np.uint8))
    assert decompress_bounded(ident or "", config, honest, LIMIT) is None  # zarr decodes it


def test_codec_ids_of_zarr_and_numcodecs_codecs() -> None:
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ZstdCodec

    assert codec_id(ZstdCodec())[0] == "zstd"
    assert codec_id(GzipCodec())[0] == "gzip"
    assert codec_id(BloscCodec())[0] == "blosc"
    assert codec_id(numcodecs.Zlib())[0] == "zlib"
    assert codec_id(numcodecs.LZMA())[0] == "lzma"
    assert codec_id(Crc32cCodec())[0] is None
    assert codec_id(BytesCodec())[0] is None


def test_other_codecs_decode_as_zarr_does_and_are_checked_after() -> None:
    assert bounded(object(), b"", 10, lambda: b"12345") == b"12345"
    with pytest.raises(CorruptDataError):
        bounded(object(), b"", 4, lambda: b"12345")


@pytest.mark.parametrize(("codecs", "stream"), [
    pytest.param([{"name": "bytes"}, {"name": "numcodecs.zlib", "configuration": {"level": 1}}],
                 STREAMS["zlib"], id="numcodecs.zlib"),
    pytest.param([{"name": "bytes"}, {"name": "numcodecs.bz2", "configuration": {"level": 1}}],
                 STREAMS["bz2"], id="numcodecs.bz2"),
    pytest.param([{"name": "transpose", "configuration": {"order": [1, 0]}}, {"name": "bytes"},
                  {"name": "zstd", "configuration": {"level": 1}}], STREAMS["zstd"], id="transpose+zstd"),
    pytest.param([{"name": "transpose", "configuration": {"order": [1, 0]}}, {"name": "bytes"},
                  {"name": "numcodecs.zlib", "configuration": {"level": 1}}, {"name": "crc32c"}],
                 lambda b: _with_crc32c(STREAMS["zlib"](b)), id="transpose+zlib+crc32c"),
])
def test_v3_codecs_without_a_synchronous_decode_are_bounded_too(tmp_path, codecs, stream, monkeypatch) -> None:
    """A v3 array whose codecs zarr-python decodes only asynchronously (numcodecs'
    wrappers, a leading transpose): each bytes->bytes stage is still bounded by the
    chunk's size, and a refused chunk is decoded once (not again, as a chunk of parts
    written one by one would be); an honest chunk of the same array reads its values."""
    import json

    import zfuse.view.bounded_decode as bounded_decode

    decodes: list[int] = []
    original = bounded_decode.bounded

    def counted(codec, data, limit, decode):
        decodes.append(len(data))
        return original(codec, data, limit, decode)

    monkeypatch.setattr(bounded_decode, "bounded", counted)

    from zfuse.daemon import MountConfig
    from zfuse.open_view import make_view

    root = tmp_path / "a.zarr"
    (root / "c" / "0").mkdir(parents=True)
    (root / "zarr.json").write_text(json.dumps({
        "zarr_format": 3, "node_type": "array", "shape": [256, 512], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [128, 512]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": codecs, "attributes": {}}))
    values = np.frombuffer(HONEST, np.uint8).reshape(128, 512)
    stored = np.ascontiguousarray(values.T) if codecs[0]["name"] == "transpose" else values
    (root / "c" / "0" / "0").write_bytes(stream(stored.tobytes()))
    (root / "c" / "1").mkdir()
    (root / "c" / "1" / "0").write_bytes(stream(bytes(BIG)))
    view = make_view(MountConfig([str(root)], "/nonexistent", read_only=True))
    array = dict(view.arrays())[()]
    assert bytes(array.pixel_bytes((0, 0))) == values.tobytes()
    decodes.clear()
    with pytest.raises(CorruptDataError, match="decompress"):
        array.pixel_bytes((1, 0))
    assert len(decodes) == 1 + (codecs[-1]["name"] == "crc32c"), decodes


def _with_crc32c(data: bytes) -> bytes:
    import struct

    import google_crc32c

    return data + struct.pack("<I", google_crc32c.value(data))


@pytest.mark.parametrize("compressor", [{"id": "zlib", "level": 1}, {"id": "bz2", "level": 1}, None])
def test_a_v2_fortran_order_array_is_decoded_within_a_bound(tmp_path, compressor) -> None:
    """[read-10] v2 arrays in F order: their chunks decode as zarr reads them (values in
    F order), within the chunk's bound like any other array's (they went through zarr's
    indexing, which bounds nothing: a 6.5 KB bz2 chunk took the daemon to 2.16 GB);
    a chunk that decodes to another size is corrupt data (EIO, one line)."""
    import json

    import zarr

    from zfuse.daemon import MountConfig
    from zfuse.open_view import make_view

    root = tmp_path / "f.zarr"
    root.mkdir()
    (root / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": [8, 12], "chunks": [4, 6], "dtype": "<u2", "order": "F",
        "compressor": compressor, "fill_value": 0, "filters": None}))
    ident = compressor["id"] if compressor else None
    encode = {"zlib": lambda b: zlib.compress(b, 1), "bz2": lambda b: bz2.compress(b, 1), None: bytes}[ident]
    values = np.arange(24, dtype="<u2").reshape(4, 6)
    (root / "0.0").write_bytes(encode(values.tobytes(order="F")))
    (root / "0.1").write_bytes(encode(b"\0" * 7))  # 7 bytes, not 48
    if ident is not None:
        (root / "1.0").write_bytes(encode(bytes(BIG)))
    assert np.array_equal(zarr.open_array(str(root))[:4, :6], values)
    view = make_view(MountConfig([str(root)], "/nonexistent", read_only=True))
    array = dict(view.arrays())[()]
    assert np.array_equal(np.frombuffer(bytes(array.pixel_bytes((0, 0))), "<u2").reshape(4, 6), values)
    with pytest.raises(CorruptDataError, match="0.1: the stored chunk (decompresses to|does not decode)"):
        array.pixel_bytes((0, 1))
    if ident is not None:
        before = _rss_peak_kib()
        with pytest.raises(CorruptDataError, match=r"1\.0: (the stored chunk decompresses to more than the 48 bytes|stored object of)"):
            array.pixel_bytes((1, 0))
        assert _rss_peak_kib() - before < BIG // 4096


def test_a_stored_jpeg_of_too_many_scans_is_refused_before_decoding() -> None:
    """[read-10] a stored JPEG chunk (imagecodecs' numcodecs codec) declaring exactly the
    chunk, but of thousands of scans: refused before it is decoded."""
    from test_tiff_input import _progressive_jpeg

    few, many = _progressive_jpeg(64, 3), _progressive_jpeg(64, 20_000)
    assert decompress_bounded("imagecodecs_jpeg", {}, few, 64 * 64) is None  # (decoded as usual)
    with pytest.raises(CorruptDataError, match="20001 scans"):
        decompress_bounded("imagecodecs_jpeg", {}, many, 64 * 64)


def test_a_stored_jpeg_2000_of_tiny_precincts_is_refused_before_decoding() -> None:
    """[read-10] a stored JPEG 2000 chunk declaring exactly the chunk (2048 x 2048 uint16)
    in precincts of 2 x 2 pixels: refused before OpenJPEG allocates them (127 bytes took
    2.3 GB a chunk); an honest stream decodes as usual."""
    import imagecodecs
    import numpy as np

    from zfuse.testing import j2k_precinct_bomb

    bomb = j2k_precinct_bomb()
    assert len(bomb) < 200
    with pytest.raises(CorruptDataError, match="precincts, more than the 65536"):
        decompress_bounded("imagecodecs_jpeg2k", {}, bomb, 2048 * 2048 * 2)
    honest = imagecodecs.jpeg2k_encode(np.arange(64 * 64, dtype="u2").reshape(64, 64))
    assert decompress_bounded("imagecodecs_jpeg2k", {}, honest, 64 * 64 * 2) is None  # (decoded as usual)


def test_a_v2_chunk_with_filters_is_decompressed_within_a_bound(tmp_path) -> None:
    """v2 arrays with filters (Delta here) and a compressor zfuse bounds: decompressed
    into at most what any filter's encoding of the chunk can be, then the filters, as
    zarr's V2Codec applies them (a 3 KB zlib chunk decompressed to 1.6 GiB before)."""
    import zarr

    from zfuse.daemon import MountConfig
    from zfuse.open_view import make_view

    root = tmp_path / "f.zarr"
    arr = zarr.create_array(str(root), shape=(16, 16), chunks=(8, 8), dtype="<u2", zarr_format=2,
                            filters=[numcodecs.Delta(dtype="<u2")], compressors=numcodecs.Zlib(level=1),
                            fill_value=0)
    values = (np.arange(256, dtype="<u2") * 7).reshape(16, 16)
    arr[...] = values
    (root / "1.1").write_bytes(zlib.compress(bytes(64 * 2**20), 1))  # (under the 1 MiB read bound)
    view = make_view(MountConfig([str(root)], "/nonexistent", read_only=True))
    array = dict(view.arrays())[()]
    assert np.array_equal(np.frombuffer(bytes(array.pixel_bytes((0, 1))), "<u2").reshape(8, 8), values[:8, 8:])
    with pytest.raises(CorruptDataError, match="decompress"):
        array.pixel_bytes((1, 1))


def test_a_jpeg_2000_stream_hiding_its_coding_is_refused_quickly() -> None:
    """[read-10] the precinct check cannot be walked past or turned into work itself: a
    stream of 10,000 marker segments before its last (tiny-precinct) COD is refused at
    the marker bound (the check stopped counting and passed it: 2.3 GB to decode); 9,000
    tile-parts each shorter than its own header are refused at once (the walk was
    quadratic: 11 s for 108 KB)."""
    import struct
    import time

    from zfuse.testing import j2k_precinct_bomb
    from zfuse.view.tiff_segments import j2k_cost_problem

    bomb = j2k_precinct_bomb(2048, levels=11)
    siz_end = 4 + struct.unpack_from(">H", bomb, 4)[0]
    qcd = b"\xff\x5c" + struct.pack(">H", 5) + bytes(3)
    flooded = bomb[:siz_end] + qcd * 10_000 + bomb[siz_end:]
    start = time.process_time()
    assert "marker segments" in (j2k_cost_problem(flooded) or "")
    parts = b"".join(b"\xff\x90" + struct.pack(">HHIBB", 10, 0, 12, 0, 0) for _ in range(9000))
    small = j2k_precinct_bomb(32, levels=1, precinct=15)
    short = small[:small.index(b"\xff\x90")] + parts + b"\xff\x93\x00\xff\xd9"
    assert j2k_cost_problem(short) is not None
    assert time.process_time() - start < 2.0


def test_a_v2_fortran_order_image_codec_chunk_reads_as_zarr_reads_it(tmp_path) -> None:
    """[read-10] a v2 array in F order whose compressor is an image codec decoded into
    the chunk's own array (JPEG XL here), chunks not square: read as zarr-python reads
    it (decoded into the shape reversed, every read had failed with EIO)."""
    import imagecodecs.numcodecs
    import zarr

    from zfuse.daemon import MountConfig
    from zfuse.open_view import make_view
    from zfuse.view import bounded_decode

    imagecodecs.numcodecs.register_codecs()
    codec = imagecodecs.numcodecs.Jpegxl(lossless=True)
    assert bounded_decode.codec_id(codec)[0] in bounded_decode.DECODED_INTO
    root = tmp_path / "f.zarr"
    a = zarr.create_array(str(root), shape=(16, 24), chunks=(8, 12), dtype="u1", zarr_format=2, order="F",
                          fill_value=0, compressors=codec)
    a[...] = (np.arange(16 * 24).reshape(16, 24) % 251).astype("u1")
    want = zarr.open_array(str(root))[8:16, 12:24]
    view = make_view(MountConfig([str(root)], "/nonexistent", read_only=True))
    array = dict(view.arrays())[()]
    assert np.array_equal(np.frombuffer(bytes(array.pixel_bytes((1, 1))), "u1").reshape(8, 12), want)
