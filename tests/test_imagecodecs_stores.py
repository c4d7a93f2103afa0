"""Arrays compressed with imagecodecs' numcodecs codecs (PNG, JPEG, JPEG 2000, LERC, JPEG XL,
WebP, ...), as zarr-python 2.18 writes them after ``imagecodecs.numcodecs.register_codecs()``:
shown and read on a real mount, each chunk's decoded size bounded by the chunk's size.

The stores are written by zarr 2.18 itself (ZFUSE_ZARR2_PYTHON, `make test` sets it up with
imagecodecs), and what zarr 2.18 reads back is what the mount must show.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import textwrap
import zlib
from pathlib import Path

import imagecodecs
import imagecodecs.numcodecs as icn
import numpy as np
import pytest
import tifffile

from zfuse.errors import CorruptDataError
from zfuse.testing import assert_no_traceback, errno_of
from zfuse.view import bounded_decode
from zfuse.view.codec_packages import register_imagecodecs

ZARR2 = os.environ.get("ZFUSE_ZARR2_PYTHON")
needs_zarr2 = pytest.mark.skipif(not ZARR2, reason="set ZFUSE_ZARR2_PYTHON to a zarr 2.18 python "
                                 "with imagecodecs (`make test` builds .venv-zarr2)")

# a 70-byte LERC blob declaring a 40000 x 40000 uint8 image (1.6 GB decoded), made by
# imagecodecs.lerc_encode(np.zeros((40000, 40000), np.uint8)): kept, as making it takes 2 s
LERC_40K = bytes.fromhex(
    "4c657263322004000000e80fecb6409c0000409c00000100000000105e5f080000004600000001000000"
    "000000000000e03f0000000000000000000000000000000000000000")


def png_declaring(height: int, width: int) -> bytes:
    """A PNG stream whose header declares height x width 8-bit grey pixels; its data is a
    few zero rows, so nothing but the header says how large it is."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(64)))
            + chunk(b"IEND", b""))


# -- bounded_decode, no mount ------------------------------------------------------------


def test_declared_image_size_is_checked_before_decoding() -> None:
    """[read-10] A PNG header declaring 40000x40000 in a 64x64 chunk is refused from its
    header; an honest PNG, JPEG, JPEG 2000 and WebP stream of the chunk's size passes."""
    register_imagecodecs()
    limit = 64 * 64
    with pytest.raises(CorruptDataError, match="PNG header declares an image of 1600000000 bytes"):
        bounded_decode.decompress_bounded("imagecodecs_png", {}, png_declaring(40000, 40000), limit)
    with pytest.raises(CorruptDataError, match="not a JPEG 2000 stream"):
        bounded_decode.decompress_bounded("imagecodecs_jpeg2k", {}, b"not an image", limit)
    grey = (np.arange(limit) % 251).astype(np.uint8).reshape(64, 64)
    rgb = np.stack([grey] * 3, axis=-1)
    for codec, image in ((icn.Png(), grey), (icn.Jpeg(), grey), (icn.Jpeg2k(), grey),
                         (icn.Webp(lossless=True), rgb), (icn.Png(), grey.astype(np.uint16))):
        ident, config = bounded_decode.codec_id(codec)
        assert ident == config["id"]
        stream = codec.encode(image)
        assert bounded_decode.declared_size(ident, stream, config) == image.nbytes, ident
        assert bounded_decode.decompress_bounded(ident, config, stream, image.nbytes) is None
        with pytest.raises(CorruptDataError):
            bounded_decode.decompress_bounded(ident, config, stream, image.nbytes - 1)


def test_image_codecs_decode_into_the_chunk() -> None:
    """[read-10] LERC (no header zfuse reads) decodes into the chunk's own array: a blob
    declaring 40000x40000 is refused by imagecodecs before it allocates; imagecodecs' zstd
    is zfuse's bounded zstd."""
    lerc = icn.Lerc()
    with pytest.raises(CorruptDataError, match="does not decode"):
        bounded_decode.decode_into(lerc, LERC_40K, np.empty((64, 64), np.uint8))
    image = (np.arange(4096) % 7).astype(np.float32).reshape(1, 64, 64)
    got = bounded_decode.decode_into(lerc, lerc.encode(image), np.empty((1, 64, 64), np.float32))
    np.testing.assert_array_equal(got, image)
    assert bounded_decode.codec_id(icn.Zstd())[0] == "zstd"
    bomb = imagecodecs.zstd_encode(bytes(2**24))
    with pytest.raises(CorruptDataError):
        bounded_decode.decompress_bounded("zstd", {}, bomb, 4096)


# -- stores written by zarr 2.18 + imagecodecs, on a real mount -------------------------

CODECS = {  # array name -> the imagecodecs.numcodecs codec zarr 2.18 compresses it with
    "png": "Png()", "png16": "Png()", "jpeg2k": "Jpeg2k(level=0)", "lerc": "Lerc()",
    "jpegxl": "Jpegxl(lossless=True)", "webp": "Webp(lossless=True)", "jpeg": "Jpeg(level=95)",
    "zstd": "Zstd()",
}


def write_zarr2_store(root: Path) -> None:
    """Each array of CODECS (z, y, x, or y, x, rgb for WebP) written by zarr 2.18, and what
    zarr 2.18 reads back saved next to it as NAME.npy."""
    script = textwrap.dedent(f"""
        import numpy as np, zarr, imagecodecs.numcodecs as icn
        icn.register_codecs()
        g = zarr.open_group({str(root / "s.zarr")!r}, mode="w")
        plane = (np.arange(3 * 64 * 80) * 7 % 251).astype("u1").reshape(3, 64, 80)
        for name, codec in {CODECS!r}.items():
            data, chunks = plane, (1, 32, 40)
            if name == "png16":
                data = plane.astype("u2") * 257
            if name == "webp":
                data, chunks = np.stack([plane[0], plane[1], plane[2]], -1), (32, 40, 3)
            a = g.create_dataset(name, data=data, chunks=chunks, compressor=eval("icn." + codec))
            np.save({str(root)!r} + "/" + name + ".npy", a[...])
    """)
    subprocess.run([ZARR2, "-c", script], check=True, timeout=60)


@needs_zarr2
@pytest.mark.mount
def test_zarr2_imagecodecs_arrays_read_on_a_mount(tmp_path: Path, mount) -> None:
    """[read-10] Every array zarr 2.18 wrote with an imagecodecs codec is shown and each
    chunk file holds what zarr 2.18 reads; a crafted PNG chunk declaring 40000x40000 and a
    LERC chunk declaring as much give EIO for those files only, the daemon's peak memory
    staying under 1 GiB."""
    write_zarr2_store(tmp_path)
    store = tmp_path / "s.zarr"
    (store / "png" / "2.1.1").write_bytes(png_declaring(40000, 40000))
    (store / "lerc" / "2.1.1").write_bytes(LERC_40K)
    expected = {name: np.load(tmp_path / f"{name}.npy") for name in CODECS}
    m = mount(store, "-o", "ro")
    for name, data in expected.items():
        meta = json.loads((m.path / name / "zarr.json").read_text())
        assert "unsupported" not in json.dumps(meta.get("attributes", {})), (name, meta)
        webp = name == "webp"
        for key, region in ((("0.0.0", np.s_[0:32, 0:40]) if webp else ("0.0.0", np.s_[0, 0:32, 0:40])),
                            (("1.1.0", np.s_[32:64, 40:80]) if webp else ("2.1.1", np.s_[2, 32:64, 40:80]))):
            path = m.path / name / f"{key}.tiff"
            if name in ("png", "lerc") and key == "2.1.1":
                assert errno_of(path.read_bytes) == "EIO", name
                continue
            got = tifffile.imread(path)
            if webp:  # (y, x, rgb): an RGB image, its chunk files its 3 channels ([read-13])
                got = got.transpose(1, 2, 0)
            np.testing.assert_array_equal(got.reshape(data[region].shape), data[region], err_msg=f"{name} {key}")
    log = m.log()
    assert "png/2.1.1" in log and "PNG header declares" in log, log
    assert "lerc/2.1.1" in log, log
    assert_no_traceback(m)
    peak = _vm_hwm(m.pid)
    assert peak < 2**30, f"peak {peak / 2**20:.0f} MiB"
    print(f"daemon peak memory (VmHWM) {peak / 2**20:.0f} MiB")


def _vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")
