"""Every JSON example in docs/specs/ is a fixture.

Each example's metadata is read from the spec document itself (never retyped here) and
used exactly as written where it is valid; where it is not, the smallest correction is
applied by a named function and listed in ``FIXTURES`` (and docs/specs/README.md). For each
fixture the test writes data through ``zfuse.open_array``, reads it back with plain
zarr-python (transformer layouts are first reassembled by hand exactly as the prose's
"read path" says) and through one real mount of all fixtures, and checks the stored objects
against what the prose says: keys, part sizes, header bytes.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import crc32c
import numcodecs
import numpy as np
import pytest
import tifffile
import zarr

import zfuse
from zfuse.errors import MetadataError
from zfuse.ext.packbits import PackBitsCodec

from conftest import start_mount

SPECS = Path(__file__).parents[1] / "docs" / "specs"
EMPTY = 2**64 - 1


# ----------------------------------------------------------------------------- examples


def code_blocks(path: Path) -> list[str]:
    """The JSON(-like) code blocks of a spec: ```json fences, and rst code-blocks opening '{'."""
    text = path.read_text()
    if path.suffix == ".md":
        return re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL)
    blocks: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.strip().startswith(".. code-block::"):
            continue
        body: list[str] = []
        for nxt in lines[i + 1 :]:
            if nxt.strip() and not nxt.startswith((" ", "\t")):
                break
            body.append(nxt)
        block = textwrap.dedent("\n".join(body)).strip()
        if block.startswith("{"):
            blocks.append(block + "\n")
    return blocks


def example_text(spec: str, index: int) -> str:
    return code_blocks(SPECS / spec)[index]


def example(spec: str, index: int) -> dict[str, Any]:
    return json.loads(example_text(spec, index))


# (spec file, block index) -> how the example is used: None = exactly as written,
# otherwise the stated correction.
FIXTURES: dict[tuple[str, int], str | None] = {
    ("concat-parts.md", 0): (
        "refused as written (no fill_value, no array-to-bytes codec, zstd without "
        "configuration); opened with exactly the three fixes the refusal names"
    ),
    ("concat-parts.md", 1): '"fill_value": 0 added',
    ("pad-codec.md", 0): (
        "codecs fragment completed to an array: uint16, chunk_shape [256, 256] (from the "
        "prose), shape [256, 512], default chunk key encoding, fill_value 0"
    ),
    ("pad-codec.md", 1): (
        "codecs fragment completed to an array (uint8 [64, 64], chunks [32, 32], fill_value "
        "0); plus the two fixes the refusal names: a bytes codec first, gzip's configuration"
    ),
    ("pad-codec.md", 2): "N5 attributes.json of the source dataset, stored beside zarr.json as written",
    ("pad-codec.md", 3): (
        'zstd "configuration": {"level": 3, "checksum": false} added (level from the N5 '
        "attributes); for writing, the prose's padding \"AAAAAgAAAEAAAABA\" added too"
    ),
    ("suffix-chunk-key-encoding.md", 0): (
        "chunk_key_encoding fragment completed to an array (uint8 [4, 6], chunks [2, 3])"
    ),
    ("suffix-chunk-key-encoding.md", 1): (
        "chunk_key_encoding fragment completed to an array (uint8 [4, 6], chunks [2, 3])"
    ),
    ("sharding-storage-transformer-v1.rst", 0): (
        "not JSON as written: 'storage_transformers' quoted and the transformer object's "
        "closing brace added; completed to an array (uint16 [16, 16], chunks [4, 4])"
    ),
}


def test_every_json_example_is_a_fixture() -> None:
    found = {
        (p.name, i)
        for p in sorted(SPECS.iterdir())
        if p.suffix in (".md", ".rst") and p.name != "README.md"  # README: the index, not a spec
        for i in range(len(code_blocks(p)))
    }
    assert found == set(FIXTURES), "a spec example without a fixture (or a stale fixture)"
    for spec, i in FIXTURES:
        if spec.endswith(".md"):  # markdown examples are all valid JSON as written
            example(spec, i)
    with pytest.raises(json.JSONDecodeError):
        example("sharding-storage-transformer-v1.rst", 0)


def array_doc(shape: list[int], dtype: str, chunks: list[int], **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
    }  # fmt: skip
    doc.update(fields)
    return doc


def write_doc(root: Path, doc: dict[str, Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "zarr.json").write_text(json.dumps(doc, indent=2))
    return root


def plain_copy(root: Path, doc: dict[str, Any], chunks: dict[str, bytes]) -> zarr.Array:
    """A plain zarr-python array (no storage_transformers) holding ``chunks`` as its objects."""
    write_doc(root, {k: v for k, v in doc.items() if k != "storage_transformers"})
    for key, value in chunks.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(value)
    return zarr.open_array(str(root), mode="r")


def files_under(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("zarr.json", "attributes.json")
    }


# ----------------------------------------------------------------------------- builders
# Each builder makes one fixture array under ``root`` (written through zfuse.open_array),
# checks the stored objects against the prose, and returns the data it holds.


def concat_parts_1_corrected() -> dict[str, Any]:
    doc = example("concat-parts.md", 0)
    doc["fill_value"] = 0
    doc["codecs"] = [
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "zstd", "configuration": {"level": 0, "checksum": False}},
        *doc["codecs"][1:],
    ]
    return doc


def build_concat_parts_1(root: Path) -> np.ndarray:
    doc = concat_parts_1_corrected()
    write_doc(root, doc)
    data = (np.arange(1000 * 1000) % 251 + 1).astype("u1").reshape(1000, 1000)
    zfuse.open_array(str(root), mode="r+")[...] = data
    files = files_under(root)
    # "compressed_data (written to c/0/0) and the 4-byte checksum (written to c/0/0.crc32c)"
    assert sorted(files) == sorted(
        f"c/{i}/{j}{s}" for i in range(2) for j in range(2) for s in ("", ".crc32c")
    )
    for i in range(2):
        for j in range(2):
            main, crc = files[f"c/{i}/{j}"], files[f"c/{i}/{j}.crc32c"]
            assert len(crc) == 4 and int.from_bytes(crc, "little") == crc32c.crc32c(main)
            block = data[i * 500 : (i + 1) * 500, j * 500 : (j + 1) * 500]
            assert numcodecs.Zstd().decode(main) == block.tobytes()
    # read path: "reads c/0/0 and c/0/0.crc32c, concatenates them" -> plain zarr decodes that
    plain = plain_copy(
        root.parent / f"{root.name}-plain", doc,
        {k: v + files[k + ".crc32c"] for k, v in files.items() if not k.endswith(".crc32c")},
    )
    np.testing.assert_array_equal(plain[...], data)
    return data


def build_concat_parts_2(root: Path) -> np.ndarray:
    doc = example("concat-parts.md", 1)
    assert "fill_value" not in doc
    doc["fill_value"] = 0  # the one correction
    assert doc["codecs"][0]["configuration"]["codecs"] == [{"name": "packbits"}]
    write_doc(root, doc)
    rng = np.random.default_rng(2)
    a = zfuse.open_array(str(root), mode="r+")
    assert type(a.metadata.codecs[0].codecs[0]) is PackBitsCodec
    written = [  # inner chunks of 500 x 500 in two shards
        (np.s_[0:1000, 0:1000], rng.integers(1, 256, (1000, 1000), dtype="u1")),
        (np.s_[5000:5500, 9500:10000], rng.integers(1, 256, (500, 500), dtype="u1")),
    ]
    for region, block in written:
        a[region] = block
    expected = np.zeros((10000, 10000), "u1")
    for region, block in written:
        expected[region] = block

    files = files_under(root)
    shards = {"c/0/0": (0, 0), "c/1/1": (1, 1)}
    assert sorted(files) == sorted(f"{k}{s}" for k in shards for s in (".header", "", ".index"))
    for key, (si, sj) in shards.items():
        header, main, index_part = files[key + ".header"], files[key], files[key + ".index"]
        # "a 64-byte header, the main data, and a 1604-byte index"
        assert len(header) == 64 and len(index_part) == 1604
        index_bytes, crc = index_part[:-4], index_part[-4:]
        assert int.from_bytes(crc, "little") == crc32c.crc32c(index_bytes)
        index = np.frombuffer(index_bytes, "<u8").reshape(100, 2)
        shard = header + main + index_part  # offsets are relative to header + main data
        for pos, (off, nbytes) in enumerate(index):
            y, x = divmod(pos, 10)
            block = expected[
                si * 5000 + y * 500 : si * 5000 + (y + 1) * 500,
                sj * 5000 + x * 500 : sj * 5000 + (x + 1) * 500,
            ]
            if not block.any():
                assert off == EMPTY and nbytes == EMPTY
                continue
            assert shard[int(off) : int(off) + int(nbytes)] == PackBitsCodec().encode_array(block)
    # read path: header + main + index concatenated is a plain sharding_indexed shard
    plain = plain_copy(
        root.parent / f"{root.name}-plain", doc,
        {k: files[k + ".header"] + files[k] + files[k + ".index"] for k in shards},
    )
    for region, block in written:
        np.testing.assert_array_equal(plain[region], block)
    assert not plain[1000:5000, :].any()
    return expected


def build_concat_parts_2_preexisting(root: Path) -> np.ndarray:
    """The prose's own scenario: a shard assembled from pre-existing parts, where the
    header is a real 64-byte header and the index offsets account for it."""
    doc = example("concat-parts.md", 1)
    doc["fill_value"] = 0
    write_doc(root, doc)
    header = b"ZFUSE-SPEC-HEADER".ljust(64, b"\x00")
    rng = np.random.default_rng(5)
    blocks = {(0, 0): rng.integers(1, 256, (500, 500), dtype="u1"),
              (3, 7): rng.integers(1, 256, (500, 500), dtype="u1")}  # fmt: skip
    main = b""
    index = np.full((100, 2), EMPTY, "<u8")
    for (y, x), block in blocks.items():
        index[y * 10 + x] = (64 + len(main), block.size)  # relative to header + main data
        main += block.tobytes()  # packbits of full-width uint8 == the bytes themselves
    index_bytes = index.tobytes()
    (root / "c" / "0").mkdir(parents=True)
    (root / "c" / "0" / "0.header").write_bytes(header)
    (root / "c" / "0" / "0").write_bytes(main)
    (root / "c" / "0" / "0.index").write_bytes(
        index_bytes + crc32c.crc32c(index_bytes).to_bytes(4, "little")
    )
    expected = np.zeros((10000, 10000), "u1")
    for (y, x), block in blocks.items():
        expected[y * 500 : (y + 1) * 500, x * 500 : (x + 1) * 500] = block
    a = zfuse.open_array(str(root))
    np.testing.assert_array_equal(a[0:500, 0:500], blocks[(0, 0)])
    np.testing.assert_array_equal(a[1500:2000, 3500:4000], blocks[(3, 7)])
    assert not a[500:1500, :].any()
    return expected


TIFF_TAGS_IN_PROSE = {  # "Header and IFD Fields" of pad example 1
    256: 256, 257: 256, 258: 16, 259: 1, 262: 1, 273: 110, 278: 256, 279: 131072,
}  # fmt: skip


def build_pad_1(root: Path) -> np.ndarray:
    fragment = example("pad-codec.md", 0)
    doc = array_doc([256, 512], "uint16", [256, 256], codecs=fragment["codecs"])
    write_doc(root, doc)
    data = (np.arange(256 * 512, dtype="u2") * 7).reshape(256, 512)
    zfuse.open_array(str(root), mode="r+")[...] = data
    padding = base64.b64decode(fragment["codecs"][1]["configuration"]["padding"])
    assert len(padding) == 110 and padding[:8] == bytes.fromhex("49492a0008000000")
    files = files_under(root)
    assert sorted(files) == ["c/0/0", "c/0/1"]
    for j in range(2):
        blob = files[f"c/0/{j}"]
        # "prepends the 110-byte valid TIFF header": every stored chunk is a TIFF file
        assert blob[:110] == padding and len(blob) == 110 + 256 * 256 * 2
        with tifffile.TiffFile(root / "c" / "0" / str(j)) as tif:
            page = tif.pages[0]
            assert {tag: page.tags[tag].value for tag in TIFF_TAGS_IN_PROSE} == {
                tag: (v,) if tag in (273, 279) else v for tag, v in TIFF_TAGS_IN_PROSE.items()
            }
            np.testing.assert_array_equal(page.asarray(), data[:, j * 256 : (j + 1) * 256])
    np.testing.assert_array_equal(zarr.open_array(str(root))[...], data)
    return data


def pad_2_doc() -> dict[str, Any]:
    return array_doc([64, 64], "uint8", [32, 32], codecs=example("pad-codec.md", 1)["codecs"])


def build_pad_2(root: Path) -> np.ndarray:
    doc = pad_2_doc()
    doc["codecs"] = [
        {"name": "bytes"},
        {"name": "gzip", "configuration": {"level": 5}},
        doc["codecs"][1],
    ]
    write_doc(root, doc)
    data = (np.arange(64 * 64) % 13).astype("u1").reshape(64, 64)
    zfuse.open_array(str(root), mode="r+")[...] = data
    files = files_under(root)
    assert sorted(files) == [f"c/{i}/{j}" for i in range(2) for j in range(2)]
    for (i, j), blob in ((divmod(n, 2), files[f"c/{n // 2}/{n % 2}"]) for n in range(4)):
        # "gzip, and then the pad codec prepends the 16-byte custom header"
        assert blob[:16] == b"MY_CUSTOM_HEADER"
        assert gzip.decompress(blob[16:]) == data[i * 32 : (i + 1) * 32, j * 32 : (j + 1) * 32].tobytes()
    np.testing.assert_array_equal(zarr.open_array(str(root))[...], data)
    return data


N5_HEADER = b"\x00\x00\x00\x02\x00\x00\x00\x40\x00\x00\x00\x40"  # the prose's bytes literal


def n5_doc(with_padding: bool) -> dict[str, Any]:
    doc = example("pad-codec.md", 3)
    assert doc["codecs"][1] == {"name": "zstd"}
    doc["codecs"][1] = {"name": "zstd", "configuration": {"level": 3, "checksum": False}}
    if with_padding:
        doc["codecs"][2]["configuration"]["padding"] = "AAAAAgAAAEAAAABA"
    return doc


def build_pad_3_n5(root: Path) -> np.ndarray:
    """N5 blocks written independently (numcodecs zstd, big-endian), read through zarr.json."""
    attributes = example("pad-codec.md", 2)
    doc = n5_doc(with_padding=False)
    write_doc(root, doc)
    (root / "attributes.json").write_text(example_text("pad-codec.md", 2))
    assert base64.b64decode("AAAAAgAAAEAAAABA") == N5_HEADER
    header = struct.pack(">HHII", 0, 2, *attributes["blockSize"])
    assert header == N5_HEADER
    rng = np.random.default_rng(9)
    data = rng.integers(0, 2**16, size=attributes["dimensions"], dtype="u2")
    zstd = numcodecs.Zstd(level=attributes["compression"]["level"])
    for i in range(16):
        for j in range(16):
            block = data[i * 64 : (i + 1) * 64, j * 64 : (j + 1) * 64].astype(">u2")
            (root / str(i)).mkdir(exist_ok=True)
            (root / str(i) / str(j)).write_bytes(header + zstd.encode(block.tobytes()))
    np.testing.assert_array_equal(zarr.open_array(str(root))[...], data)
    np.testing.assert_array_equal(zfuse.open_array(str(root))[...], data)

    # Writing: with the prose's padding the blocks written are N5 blocks again.
    out = write_doc(root.parent / f"{root.name}-written", n5_doc(with_padding=True))
    zfuse.open_array(str(out), mode="r+")[0:128, 64:128] = data[0:128, 64:128]
    assert sorted(files_under(out)) == ["0/1", "1/1"]
    for i in range(2):
        blob = (out / str(i) / "1").read_bytes()
        assert blob[:12] == N5_HEADER
        decoded = np.frombuffer(zstd.decode(blob[12:]), ">u2").reshape(64, 64)
        np.testing.assert_array_equal(decoded, data[i * 64 : (i + 1) * 64, 64:128])
    return data


def build_suffix(root: Path, index: int) -> np.ndarray:
    doc = array_doc([4, 6], "uint8", [2, 3], chunk_key_encoding=example(
        "suffix-chunk-key-encoding.md", index))
    write_doc(root, doc)
    data = np.arange(1, 25, dtype="u1").reshape(4, 6)
    zfuse.open_array(str(root), mode="r+")[...] = data
    files = files_under(root)
    if index == 0:  # "c/1/2" + ".tiff"
        assert sorted(files) == [f"c/{i}/{j}.tiff" for i in range(2) for j in range(2)]
    else:  # v2 keys "1.2", then ".shard.zip"
        assert sorted(files) == [f"{i}.{j}.shard.zip" for i in range(2) for j in range(2)]
    first = "c/1/0.tiff" if index == 0 else "1.0.shard.zip"
    assert files[first] == data[2:4, 0:3].tobytes()
    np.testing.assert_array_equal(zarr.open_array(str(root))[...], data)
    return data


def sharding_v1_corrected_text() -> str:
    text = example_text("sharding-storage-transformer-v1.rst", 0)
    text = text.replace("storage_transformers:", '"storage_transformers":', 1)
    head, tail = text.rstrip().rsplit("]", 1)  # the list's closing bracket
    assert tail.strip() == "}"
    return head.rstrip() + "\n        }\n      ]\n    }\n"


def build_sharding_v1(root: Path) -> np.ndarray:
    fragment = json.loads(sharding_v1_corrected_text())
    (transformer,) = fragment["storage_transformers"]
    assert transformer["configuration"]["chunks_per_shard"] == [2, 2]
    doc = array_doc([16, 16], "uint16", [4, 4], **fragment)
    write_doc(root, doc)
    data = np.zeros((16, 16), "u2")
    data[0:8, 0:8] = np.arange(64).reshape(8, 8) + 1  # shard (0, 0) full
    data[8:12, 12:16] = 9  # shard (1, 1): only chunk (2, 3)
    zfuse.open_array(str(root), mode="r+")[...] = data
    files = files_under(root)
    # "the chunk grid position [96, 18] ... is transformed to the shard grid position [3, 9]"
    assert sorted(files) == ["c/0/0", "c/1/1"]
    chunks: dict[str, bytes] = {}
    for key, blob in files.items():
        si, sj = (int(p) for p in key.split("/")[1:])
        # index at the end: 16 bytes per chunk, row-major, (offset, nbytes) little-endian u64
        index = np.frombuffer(blob[-64:], "<u8").reshape(4, 2)
        for pos, (off, nbytes) in enumerate(index):
            y, x = si * 2 + pos // 2, sj * 2 + pos % 2
            block = data[y * 4 : (y + 1) * 4, x * 4 : (x + 1) * 4]
            if not block.any():  # empty: "both offset and nbytes to 2^64 - 1"
                assert off == EMPTY and nbytes == EMPTY
                continue
            assert blob[int(off) : int(off) + int(nbytes)] == block.astype("<u2").tobytes()
            chunks[f"c/{y}/{x}"] = blob[int(off) : int(off) + int(nbytes)]
    assert len(files["c/1/1"]) == 32 + 64
    plain = plain_copy(root.parent / f"{root.name}-plain", doc, chunks)
    np.testing.assert_array_equal(plain[...], data)
    return data


BUILDERS: dict[str, Callable[[Path], np.ndarray]] = {
    "concat_parts_1": build_concat_parts_1,
    "concat_parts_2": build_concat_parts_2,
    "concat_parts_2_preexisting": build_concat_parts_2_preexisting,
    "pad_1": build_pad_1,
    "pad_2": build_pad_2,
    "pad_3_n5": build_pad_3_n5,
    "suffix_1": lambda root: build_suffix(root, 0),
    "suffix_2": lambda root: build_suffix(root, 1),
    "sharding_v1": build_sharding_v1,
}


@pytest.mark.parametrize("name", BUILDERS)
def test_example_writes_and_reads(tmp_path: Path, name: str) -> None:
    data = BUILDERS[name](tmp_path / name)
    back = zfuse.open_array(str(tmp_path / name))
    np.testing.assert_array_equal(back[...], data)


# ----------------------------------------------------------------------------- refusals


def test_concat_parts_example_1_refused_with_every_fix(tmp_path: Path) -> None:
    root = write_doc(tmp_path / "crc.zarr", example("concat-parts.md", 0))
    with pytest.raises(MetadataError) as caught:
        zfuse.open_array(str(root))
    message = str(caught.value)
    assert message.startswith(f"array file://{root}: zarr.json is not valid Zarr v3 array metadata")
    assert "(3 problems)" in message
    assert '- fill_value: missing (the value of chunks never written). Add "fill_value": 0' in message
    assert (
        "- codecs: no array-to-bytes codec ('zstd' and 'crc32c' are bytes-to-bytes); "
        "a codec list needs exactly one to turn the array into bytes. "
        'Add {"name": "bytes", "configuration": {"endian": "little"}} before \'zstd\''
    ) in message
    assert (
        "- codecs[0] ('zstd'): \"configuration\" is missing and zarr-python requires it. "
        'Add "configuration": {"level": 0, "checksum": false}'
    ) in message
    assert "KeyError" not in message
    # the fixes, applied as the message says, are exactly the corrected fixture
    assert concat_parts_1_corrected() == {
        **example("concat-parts.md", 0),
        "fill_value": 0,
        "codecs": [
            {"name": "bytes", "configuration": {"endian": "little"}},
            {"name": "zstd", "configuration": {"level": 0, "checksum": False}},
            {"name": "crc32c"},
        ],
    }
    before = files_under(root)
    # `zfuse info` shows the same message
    result = subprocess.run(
        [sys.executable, "-m", "zfuse.cli", "info", str(root)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    # plain zarr.open_group/zfuse.open_group on the array say the same, not "not a group"
    with pytest.raises(MetadataError) as again:
        zfuse.open_group(str(root), mode="r")
    assert str(again.value) == message
    assert files_under(root) == before  # refusing changes nothing


def test_pad_example_2_refused_with_its_fixes(tmp_path: Path) -> None:
    root = write_doc(tmp_path / "p.zarr", pad_2_doc())
    with pytest.raises(MetadataError) as caught:
        zfuse.open_array(str(root))
    message = str(caught.value)
    assert "(2 problems)" in message
    assert (
        "- codecs[0] ('gzip'): \"configuration\" is missing and zarr-python requires it. "
        'Add "configuration": {"level": 5}'
    ) in message
    assert "('gzip' and 'pad' are bytes-to-bytes)" in message
    assert 'Add {"name": "bytes", "configuration": {"endian": "little"}} before \'gzip\'' in message


def test_n5_example_as_written_names_zstd_configuration(tmp_path: Path) -> None:
    root = write_doc(tmp_path / "n5", example("pad-codec.md", 3))
    with pytest.raises(MetadataError, match=r"\(1 problem\):\n  - codecs\[1\] \('zstd'\): "):
        zfuse.open_array(str(root))


def test_sharding_v1_block_corrected_minimally() -> None:
    """The only differences: the key quoted and the transformer object's brace closed."""

    def squeeze(text: str) -> str:
        return re.sub(r"\s", "", text)

    corrected = squeeze(sharding_v1_corrected_text())
    unquoted = corrected.replace('"storage_transformers"', "storage_transformers", 1)
    assert unquoted.replace("}}]", "}]", 1) == squeeze(example_text(
        "sharding-storage-transformer-v1.rst", 0))


# ----------------------------------------------------------------------------- the mount


@pytest.fixture(scope="module")
def fixtures_group(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("spec") / "examples.zarr"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
    scratch = root.parent / "scratch"
    data = {}
    for name, build in BUILDERS.items():
        data[name] = build(scratch / name)
        # move the finished array into the group (the builders' side copies stay outside)
        (scratch / name).rename(root / name)
    return root, data


@pytest.fixture(scope="module")
def mounted(fixtures_group: tuple[Path, dict[str, np.ndarray]],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root, _ = fixtures_group
    mnt = start_mount([str(root)], tmp_path_factory.mktemp("mnt") / "m")
    try:
        yield mnt.path
    finally:
        mnt.unmount()


def chunk_key(name: str, coords: tuple[int, int]) -> str:
    i, j = coords
    return {
        "pad_3_n5": f"{i}/{j}",
        "suffix_1": f"c/{i}/{j}.tiff",
        "suffix_2": f"{i}.{j}.shard.zip",
    }.get(name, f"c/{i}/{j}")


# inner chunk shape and grid positions that must be listed, per fixture
EXPECTED_FILES: dict[str, tuple[tuple[int, int], list[tuple[int, int]]]] = {
    "concat_parts_1": ((500, 500), [(i, j) for i in range(2) for j in range(2)]),
    "concat_parts_2": ((500, 500), [(0, 0), (0, 1), (1, 0), (1, 1), (10, 19)]),
    "concat_parts_2_preexisting": ((500, 500), [(0, 0), (3, 7)]),
    "pad_1": ((256, 256), [(0, 0), (0, 1)]),
    "pad_2": ((32, 32), [(i, j) for i in range(2) for j in range(2)]),
    "pad_3_n5": ((64, 64), [(i, j) for i in range(16) for j in range(16)]),
    "suffix_1": ((2, 3), [(i, j) for i in range(2) for j in range(2)]),
    "suffix_2": ((2, 3), [(i, j) for i in range(2) for j in range(2)]),
    "sharding_v1": ((4, 4), [(0, 0), (0, 1), (1, 0), (1, 1), (2, 3)]),
}


@pytest.mark.mount
@pytest.mark.parametrize("name", BUILDERS)
def test_example_chunk_files_in_the_mount(
    mounted: Path, fixtures_group: tuple[Path, dict[str, np.ndarray]], name: str
) -> None:
    _, data = fixtures_group
    shape, coords = EXPECTED_FILES[name]
    array_dir = mounted / name
    listed = sorted(
        p.relative_to(array_dir).as_posix() for p in array_dir.rglob("*.tiff") if p.is_file()
    )
    assert listed == sorted(chunk_key(name, c) + ".tiff" for c in coords)
    # no part, header or index objects are shown
    assert not [p for p in array_dir.rglob("*") if p.name.endswith((".header", ".index", ".crc32c"))]
    sample = coords if len(coords) <= 8 else coords[:: len(coords) // 8]
    for c in sample:
        got = tifffile.imread(array_dir / (chunk_key(name, c) + ".tiff"))
        block = data[name][tuple(slice(k * s, (k + 1) * s) for k, s in zip(c, shape, strict=True))]
        np.testing.assert_array_equal(got.reshape(shape), block, err_msg=f"{name} {c}")
    view = json.loads((array_dir / "zarr.json").read_text())
    assert view["shape"] == list(data[name].shape)


@pytest.mark.mount
def test_concat_parts_example_2_written_through_the_mount(
    mounted: Path, fixtures_group: tuple[Path, dict[str, np.ndarray]]
) -> None:
    """A TIFF written into the mount lands as header / data / index parts, as the prose says."""
    root, data = fixtures_group
    target = mounted / "concat_parts_2" / "c" / "2" / "3.tiff"
    block = np.random.default_rng(11).integers(1, 256, (500, 500), dtype="u1")
    tifffile.imwrite(target, block)
    np.testing.assert_array_equal(tifffile.imread(target), block)
    shard = root / "concat_parts_2" / "c" / "0" / "0"
    header = (shard.parent / "0.header").read_bytes()
    index_part = (shard.parent / "0.index").read_bytes()
    assert len(header) == 64 and len(index_part) == 1604
    index = np.frombuffer(index_part[:-4], "<u8").reshape(100, 2)
    off, nbytes = (int(v) for v in index[2 * 10 + 3])
    assembled = header + shard.read_bytes() + index_part
    assert assembled[off : off + nbytes] == block.tobytes()
    np.testing.assert_array_equal(
        zfuse.open_array(str(root / "concat_parts_2"))[1000:1500, 1500:2000], block
    )
    data["concat_parts_2"][1000:1500, 1500:2000] = block  # keep the module's record true
