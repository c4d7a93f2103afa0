"""Hostile TIFFs against the write path's parser, FUSE-free: each is refused with
InvalidTiffError naming the problem, in bounded time and memory.

Each case runs `decode_tiff` (and `walk_tiff`, what `close()` runs first) in a
forked child that reports its peak memory growth (VmHWM over the RSS it
started with): the bounds asserted are generous (the unbounded parse cost
gigabytes and minutes); timings are bounds, never figures.
"""

from __future__ import annotations

import functools
import io
import multiprocessing
import time
from collections.abc import Callable

import numpy as np
import pytest
import tifffile

import zfuse.testing as h
from zfuse.errors import InvalidTiffError
from zfuse.view.tiff import plan_layout
from zfuse.view.tiff_complete import incomplete_reason, walk_tiff
from zfuse.view.tiff_input import decode_tiff, max_file_size
from zfuse.view.tiff_segments import declared_dims

MEMORY_BOUND = 200 * 2**20  # bytes a refusal may grow the process by
TIME_BOUND = 20.0  # seconds: the unbounded cases took minutes or never ended


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(field)


def _child(job: Callable[[], object], conn: multiprocessing.connection.Connection) -> None:
    start = _status("VmRSS")
    began = time.monotonic()
    try:
        job()
        outcome = "accepted"
    except InvalidTiffError as e:
        outcome = f"InvalidTiffError: {e}"
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        outcome = f"{type(e).__name__}: {e}"
    conn.send((outcome, time.monotonic() - began, _status("VmHWM") - start))


def bounded(job: Callable[[], object]) -> str:
    """Run `job` in a forked child; assert it ends within the time and memory bounds and
    return its outcome ("accepted" or "InvalidTiffError: ...")."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(job, child))
    proc.start()
    try:
        assert parent.poll(TIME_BOUND), f"still running after {TIME_BOUND} s"
        outcome, seconds, grown = parent.recv()
    finally:
        proc.kill()
        proc.join()
    assert grown < MEMORY_BOUND, f"{outcome}: grew {grown / 2**20:.0f} MiB"
    return outcome


def refused(data: bytes, shape: tuple[int, ...], dtype: str = "u1", *words: str) -> str:
    layout = plan_layout(shape, np.dtype(dtype))
    assert len(data) <= max_file_size(layout), "a write this large is refused with EFBIG already"

    def job() -> None:
        walk_tiff(data, [shape], max_file_size(layout))
        decode_tiff(data, chunk_shape=shape, dtype=dtype, layout=layout)

    outcome = bounded(job)
    assert outcome.startswith("InvalidTiffError"), outcome
    for word in words:
        assert word.lower() in outcome.lower(), outcome
    return outcome


# -- the IFD chain --------------------------------------------------------------
def test_an_ifd_pointing_at_itself_is_refused() -> None:
    data = h.self_loop(16, 16)
    assert incomplete_reason(data, [(16, 16)]) is None  # not pending: refused
    assert "loops" in (walk_tiff(data, [(16, 16)]).problem or "")
    refused(data, (16, 16), "u1", "loops")


def test_two_ifds_pointing_at_each_other_are_refused() -> None:
    refused(h.mutual_loop(16, 16), (2, 16, 16), "u1", "loops")


def test_half_a_million_pages_are_refused_after_a_few() -> None:
    data = h.many_pages(500_000)
    walk = walk_tiff(data, [(4096, 4096)])
    assert walk.problem and "IFDs" in walk.problem
    refused(data, (4096, 4096), "u1", "more than 18 IFDs")


def test_pages_within_the_limit_still_decode() -> None:
    """A chunk's planes plus as many thumbnails pass the IFD limit."""
    planes = np.arange(5 * 8 * 8, dtype=np.uint8).reshape(5, 8, 8)
    buf = io.BytesIO()
    with tifffile.TiffWriter(buf) as tw:
        for plane in planes:
            tw.write(plane, photometric="minisblack", metadata=None)
            tw.write(plane[:4, :4], photometric="minisblack", subfiletype=1, metadata=None)
    got = decode_tiff(buf.getvalue(), chunk_shape=(5, 8, 8), dtype="u1")
    np.testing.assert_array_equal(got, planes)


# -- tag counts -----------------------------------------------------------------
def test_sixty_five_thousand_tags_claiming_one_region_are_refused() -> None:
    data = h.huge_counts()
    refused(data, (2048, 2048), "u2", "overlapping")


def test_ten_tags_claiming_one_region_are_refused() -> None:
    refused(h.huge_counts(entries=10), (2048, 2048), "u2", "overlapping")


def test_a_tag_past_any_file_of_the_chunk_is_refused_not_pending() -> None:
    """A value that would end past the largest file the chunk may have can never be
    completed: refused, where one ending just past what is written is pending."""
    rows = cols = 16
    layout = plan_layout((rows, cols), np.dtype("u1"))
    far = h.one_strip(rows, cols, bytes(rows * cols), count=max_file_size(layout) * 2)
    walk = walk_tiff(far, [(rows, cols)], max_file_size(layout))
    assert walk.incomplete is None and walk.problem and "may have" in walk.problem
    near = h.one_strip(rows, cols, bytes(rows * cols), count=rows * cols + 1000)
    assert walk_tiff(near, [(rows, cols)], max_file_size(layout)).incomplete


# -- strips ---------------------------------------------------------------------
def test_a_strip_with_byte_count_zero_is_refused() -> None:
    refused(h.one_strip(16, 16, bytes(256), count=0), (16, 16), "u1", "byte count 0")


def test_an_uncompressed_strip_shorter_than_its_rows_is_refused() -> None:
    refused(h.one_strip(16, 16, bytes(200)), (16, 16), "u1", "200 bytes")


@pytest.mark.parametrize("codec,compression", [("lzma", 34925), ("lzw", 5), ("zlib", 8),
                                               ("zstd", 50000), ("packbits", 32773)])
def test_byte_codec_strips_decoding_to_more_or_fewer_bytes_are_refused(codec: str, compression: int) -> None:
    import imagecodecs

    encode = getattr(imagecodecs, f"{codec}_encode")
    more = h.one_strip(64, 64, encode(bytes(64 * 64 * 64)), compression=compression)
    refused(more, (64, 64), "u1", "more bytes")
    fewer = h.one_strip(64, 64, encode(bytes(64 * 63)), compression=compression)
    refused(fewer, (64, 64), "u1", "fewer bytes")
    exact = h.one_strip(64, 64, encode(bytes(range(256)) * 16), compression=compression)
    got = decode_tiff(exact, chunk_shape=(64, 64), dtype="u1")
    np.testing.assert_array_equal(got.ravel(), np.frombuffer(bytes(range(256)) * 16, np.uint8))


def test_strips_sharing_their_bytes_are_refused() -> None:
    """[write-12] 512 strips all pointing at one 4 MiB run of the file: refused before
    any is read (each read on its own, the tiles of a 21 MB file cost 287 s of CPU)."""
    refused(h.shared_strips(512, 512), (512, 512), "u2", "share bytes")


# -- image codecs ---------------------------------------------------------------
def test_a_jpeg_2000_strip_of_tiny_precincts_is_refused() -> None:
    """[write-12] a JPEG 2000 strip declaring exactly the chunk, coded in 2 x 2
    precincts: refused from its COD marker (a 250-byte TIFF took the daemon to 2.3 GB,
    and close() returned 0)."""
    strip = h.j2k_precinct_bomb(512, levels=9)
    refused(h.one_strip(512, 512, strip, compression=34712, bits=16), (512, 512), "u2", "precincts")



@functools.cache
def _stream(codec: str, side: int) -> bytes:
    return h.codec_stream(codec, side, side)


@pytest.mark.parametrize("codec", ["png", "jpeg2k", "webp", "jpeg8"])
def test_image_codec_bombs_are_refused_from_their_headers(codec: str) -> None:
    """A strip whose stream declares 8192x8192 pixels in a 256x256 chunk."""
    stream = _stream(codec, 8192)
    declared = declared_dims({"png": "PNG", "jpeg2k": "JPEG 2000", "webp": "WebP",
                              "jpeg8": "JPEG"}[codec], stream)
    assert declared is not None and declared[:2] == (8192, 8192)
    data = h.one_strip(256, 256, stream, compression=h.COMPRESSION[codec])
    refused(data, (256, 256), "u1", "8192x8192")


def test_a_png_header_declaring_forty_thousand_squared_is_refused() -> None:
    data = h.one_strip(256, 256, h.png_header_bomb(40000, 40000), compression=34933)
    refused(data, (256, 256), "u1", "40000x40000")


@pytest.mark.parametrize("codec,side", [("lerc", 8192), ("jpegxl", 2048), ("jpegxr", 8192)])
def test_codecs_whose_output_cannot_be_bounded_are_refused(codec: str, side: int) -> None:
    data = h.one_strip(256, 256, _stream(codec, side), compression=h.COMPRESSION[codec])
    refused(data, (256, 256), "u1", "not accepted")


def test_a_png_strip_of_other_dimensions_is_refused() -> None:
    """128x512 pixels are as many as 256x256, but not the strip."""
    stream = h.codec_stream("png", 128, 512)
    refused(h.one_strip(256, 256, stream, compression=34933), (256, 256), "u1", "128x512")


@pytest.mark.parametrize("compression", ["png", "jpeg2000", "jpeg", "zlib", "lzw", "lzma", "zstd",
                                         "packbits"])
@pytest.mark.parametrize("tiled", [False, True])
def test_accepted_codecs_still_decode_in_strips_and_tiles(compression: str, tiled: bool) -> None:
    """Honest files with every accepted codec pass the checks, edge tiles and a short
    last strip included."""
    values = (np.arange(40 * 35, dtype=np.uint32) % 251).astype(np.uint8).reshape(40, 35)
    if compression == "jpeg":
        values = np.full((40, 35), 77, np.uint8)  # lossy: a flat image round-trips
    buf = io.BytesIO()
    layout = {"tile": (16, 16)} if tiled else {"rowsperstrip": 16}
    tifffile.imwrite(buf, values, photometric="minisblack", compression=compression, metadata=None,
                     **layout)  # type: ignore[arg-type]
    got = bounded(functools.partial(decode_tiff, buf.getvalue(), chunk_shape=(40, 35), dtype="u1"))
    assert got == "accepted"
    np.testing.assert_array_equal(decode_tiff(buf.getvalue(), chunk_shape=(40, 35), dtype="u1"), values)


# -- refused at the write that shows it -------------------------------------------------
def test_early_refusal_decides_once_the_first_ifd_is_there() -> None:
    """[write-13] a prefix decides nothing at constant cost; the whole first IFD decides:
    another pixel type or plane size is refused, the chunk's own accepted; an IFD whose
    size is not set yet is a full look, counted by the caller (EARLY_LOOKS)."""
    from zfuse.view.tiff_complete import early_refusal

    u2 = np.dtype("u2")
    wrong = tifffile_bytes(np.ones((3, 8, 16), "float32"))
    right = tifffile_bytes(np.ones((3, 8, 16), "uint16"))
    assert early_refusal(wrong[:8], [(3, 8, 16)], u2) == (False, False, None)
    decided, looked, reason = early_refusal(wrong, [(3, 8, 16)], u2)
    assert decided and looked and reason and "float32" in reason and "uint16" in reason
    assert early_refusal(right, [(3, 8, 16)], u2) == (True, True, None)
    shape = early_refusal(right, [(3, 9, 16)], u2).reason
    assert shape is not None and "8x16" in shape and "9x16" in shape
    zero_width = h.one_strip(8, 16, bytes(256), bits=16)
    patched = bytearray(zero_width)
    at = zero_width.index(bytes.fromhex("0001030001000000"))  # ImageWidth, SHORT, 1
    patched[at + 8 : at + 10] = b"\0\0"
    assert early_refusal(bytes(patched), [(8, 16)], u2) == (False, True, None)


def tifffile_bytes(values: np.ndarray) -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, values, photometric="minisblack", metadata=None)
    return buf.getvalue()


def test_a_walk_stops_at_its_entry_budget_without_deciding() -> None:
    """close() walks a file of few IFD entries on the event loop and defers the rest to a
    worker thread: a stopped walk decides nothing, an unstopped one is the full walk."""
    plain = tifffile_bytes(np.ones((3, 8, 16), "uint16"))
    shapes = [(3, 8, 16)]
    assert walk_tiff(plain, shapes, max_entries=256) == walk_tiff(plain, shapes)
    assert walk_tiff(plain[:-40], shapes, max_entries=256) == walk_tiff(plain[:-40], shapes)
    stopped = walk_tiff(h.huge_counts(region=2**16, entries=1000), [(64, 64)], max_entries=256)
    assert stopped.deferred and stopped.problem is None and stopped.incomplete is None
