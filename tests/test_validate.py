"""zfuse.ext.validate: broken v3 array metadata is refused with the array, the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import zfuse
from zfuse.errors import MetadataError
from zfuse.ext.validate import validate_array_metadata


def good_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "zarr_format": 3, "node_type": "array", "shape": [8, 8], "data_type": "uint16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
    }  # fmt: skip
    doc.update(changes)
    return doc


def without(key: str) -> dict[str, Any]:
    doc = good_doc()
    del doc[key]
    return doc


def sharded(inner: list[Any]) -> list[dict[str, Any]]:
    return [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [2, 2], "codecs": inner,
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}]  # fmt: skip


CASES: list[tuple[dict[str, Any], list[str]]] = [
    (without("fill_value"), ['- fill_value: missing (the value of chunks never written). Add "fill_value": 0']),
    (dict(without("fill_value"), data_type="float32"), ['Add "fill_value": 0.0 (or "NaN")']),
    (dict(without("fill_value"), data_type="bool"), ['Add "fill_value": false']),
    (without("codecs"), ['- codecs: missing. Add "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]']),
    (without("chunk_key_encoding"), ['Add "chunk_key_encoding": {"name": "default"}']),
    (without("shape"), ["- shape: missing; Zarr v3 array metadata requires it"]),
    (
        good_doc(codecs=[{"name": "crc32c"}]),
        ["- codecs: no array-to-bytes codec ('crc32c' is bytes-to-bytes)",
         'Add {"name": "bytes", "configuration": {"endian": "little"}} before \'crc32c\''],
    ),
    (
        good_doc(codecs=[{"name": "transpose", "configuration": {"order": [1, 0]}}]),
        ["no array-to-bytes codec ('transpose' is array-to-array)"],
    ),
    (
        good_doc(codecs=[{"name": "lz5"}, {"name": "bytes"}]),
        ["- codecs[0]: unknown codec 'lz5'. zarr-python with zfuse knows ", "packbits", "pad",
         "install the package that registers 'lz5' (a 'zarr.codecs' entry point)"],
    ),
    (
        good_doc(codecs=[{"name": "bytes"}, {"name": "packbits"}]),
        ["- codecs: 2 array-to-bytes codecs ('bytes', 'packbits'); keep exactly one"],
    ),
    (
        good_doc(codecs=[{"name": "bytes"}, {"name": "transpose", "configuration": {"order": [1, 0]}}]),
        ["- codecs: 'transpose' (codecs[1]) must come before 'bytes' (codecs[0])"],
    ),
    (
        good_doc(codecs=sharded([{"name": "zstd", "configuration": {"level": 1, "checksum": False}}])),
        ["- codecs[0].configuration.codecs: no array-to-bytes codec ('zstd' is bytes-to-bytes)"],
    ),
    (
        good_doc(codecs=sharded([{"name": "bytes"}, {"name": "nope"}])),
        ["- codecs[0].configuration.codecs[1]: unknown codec 'nope'"],
    ),
    (
        good_doc(codecs=[{"name": "packbits", "configuration": {"bits": 3}}]),
        ["- codecs[0] ('packbits'): invalid configuration: packbits codec: unknown configuration keys ['bits']"],
    ),
    (
        good_doc(data_type="uint4"),
        ["- data_type: 'uint4' is not a data type zarr-python 3.1 knows. Use one of ", "uint8"],
    ),
    (
        good_doc(storage_transformers=[{"name": "rot13"}]),
        ["- storage_transformers[0]: unknown storage transformer 'rot13'",
         "remove it, or open the array with a tool that implements it"],
    ),
    (
        good_doc(storage_transformers=[{"name": "concat-parts", "configuration": {"parts": []}}]),
        ["- storage_transformers[0]"],
    ),
    (
        good_doc(chunk_key_encoding={"name": "dots"}),
        ["chunk_key_encoding", 'Use e.g. {"name": "default"}'],
    ),
    (
        good_doc(fill_value="seven"),  # everything else fine: zarr-python's own complaint
        ["- zarr-python refuses it: "],
    ),
    (
        good_doc(codecs=[{"name": "packbits", "configuration": {"last_bit": 16}}]),
        ["- zarr-python refuses it: MetadataError: packbits codec: bits first_bit=0..last_bit=16"],
    ),
]


@pytest.mark.parametrize(("doc", "needles"), CASES)
def test_refusals_name_the_array_field_and_fix(tmp_path: Path, doc: dict[str, Any], needles: list[str]) -> None:
    root = tmp_path / "bad.zarr"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(MetadataError) as caught:
        zfuse.open_array(str(root), mode="r+")
    message = str(caught.value)
    assert message.startswith(f"array file://{root}: zarr.json is not valid Zarr v3 array metadata")
    for needle in needles:
        assert needle in message, message
    assert json.loads((root / "zarr.json").read_text()) == doc  # nothing rewritten


def test_every_problem_at_once() -> None:
    doc = good_doc(data_type="uint4", codecs=[{"name": "lz5"}, {"name": "zstd"}])
    del doc["fill_value"]
    with pytest.raises(MetadataError, match=r"\(4 problems\)") as caught:
        validate_array_metadata(doc, "somewhere/arr")
    lines = str(caught.value).splitlines()
    assert lines[0].startswith("array somewhere/arr: ")
    assert [line.split(":")[0] for line in lines[1:]] == [
        "  - fill_value", "  - data_type", "  - codecs[0]", "  - codecs[1] ('zstd')",
    ]


@pytest.mark.parametrize(
    "doc",
    [
        good_doc(),
        good_doc(codecs=[{"name": "packbits", "configuration": {"padding_encoding": "first_byte"}}]),
        good_doc(codecs=sharded([{"name": "bytes"}]), storage_transformers=[
            {"name": "concat-parts", "configuration": {"parts": [{"key_suffix": ""}]}}]),
        {"zarr_format": 3, "node_type": "group"},
        {"zarr_format": 2, "shape": [1]},  # not v3 array metadata: not this check's business
        [1, 2, 3],
    ],
)
def test_valid_or_foreign_documents_pass(doc: Any) -> None:
    validate_array_metadata(doc, "x")


def test_valid_array_opens_unchanged(tmp_path: Path) -> None:
    root = tmp_path / "ok.zarr"
    root.mkdir()
    doc = good_doc(codecs=[{"name": "packbits", "configuration": {"first_bit": 2}}])
    (root / "zarr.json").write_text(json.dumps(doc))
    a = zfuse.open_array(str(root), mode="r+")
    a[...] = np.arange(64, dtype="u2").reshape(8, 8) * 4
    np.testing.assert_array_equal(zarr.open_array(str(root))[...], np.arange(64).reshape(8, 8) * 4)
    assert json.loads((root / "zarr.json").read_text()) == doc


def test_not_json(tmp_path: Path) -> None:
    root = tmp_path / "x.zarr"
    root.mkdir()
    (root / "zarr.json").write_text("{not json")
    with pytest.raises(MetadataError, match=r"^array file://.*x\.zarr: zarr.json is not valid JSON"):
        zfuse.open_array(str(root))


def test_group_path_holding_a_bad_array(tmp_path: Path) -> None:
    root = tmp_path / "g.zarr"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps(without("fill_value")))
    with pytest.raises(MetadataError, match="fill_value: missing"):
        zfuse.open_group(str(root), mode="r")
    # a group with a bad member still opens: reporting members is the caller's business
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
    (root / "bad").mkdir()
    (root / "bad" / "zarr.json").write_text(json.dumps(without("fill_value")))
    zfuse.open_group(str(root), mode="r")
    with pytest.raises(MetadataError, match=r"^array file://.*g\.zarr/bad: "):
        zfuse.open_array(str(root), path="bad")
