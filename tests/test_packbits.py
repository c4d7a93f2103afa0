"""The ``packbits`` codec (zfuse.ext.packbits) against the zarr-extensions spec (docs/specs/packbits-codec.md).

Worked vectors below are derived by hand from the spec's "Format and algorithm" section (the
spec itself has no byte examples; zarrs publishes round-trip tests only, mirrored here for
its int16 first_bit/last_bit grid). A slow pure-Python transcription of that section is the
oracle for the property tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.storage import LocalStore, MemoryStore

from zfuse.errors import CorruptDataError, MetadataError
from zfuse.ext.packbits import PackBitsCodec, component_layout

PADDINGS = ["none", "first_byte", "last_byte"]
DTYPES = [
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]


# ----------------------------------------------------------------------------- oracle


def components(arr: np.ndarray) -> list[int]:
    """Each component's N-bit little-endian value as a Python int (the spec's first step)."""
    n_bits, _, _ = component_layout(arr.dtype)
    if n_bits == 1:
        return [int(v) for v in arr.reshape(-1)]
    raw = np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"))).tobytes()
    size = n_bits // 8
    return [int.from_bytes(raw[i : i + size], "little") for i in range(0, len(raw), size)]


def reference_encode(arr: np.ndarray, padding: str, first: int | None, last: int | None) -> bytes:
    """The spec's algorithm, one bit at a time."""
    n_bits, _, _ = component_layout(arr.dtype)
    first = 0 if first is None else first
    last = n_bits - 1 if last is None else last
    bits = [(v >> j) & 1 for v in components(arr) for j in range(first, last + 1)]
    pad = (-len(bits)) % 8
    bits += [0] * pad
    # "Encoded byte i corresponds to bits [i*8, (i+1)*8)", bit numbering from the LSB
    body = bytes(sum(bits[8 * i + j] << j for j in range(8)) for i in range(len(bits) // 8))
    return {"none": body, "first_byte": bytes([pad]) + body, "last_byte": body + bytes([pad])}[
        padding
    ]


def reference_decoded(arr: np.ndarray, first: int | None, last: int | None) -> np.ndarray:
    """What decoding must give back: kept bits in place, sign- or zero-extended from last_bit."""
    n_bits, _, signed = component_layout(arr.dtype)
    first = 0 if first is None else first
    last = n_bits - 1 if last is None else last
    out = []
    for v in components(arr):
        kept = (v >> first) & ((1 << (last - first + 1)) - 1)
        value = kept << first
        if signed and (value >> last) & 1:
            value |= ((1 << n_bits) - 1) & ~((1 << (last + 1)) - 1)
        out.append(value)
    if n_bits == 1:
        return np.array(out, dtype=bool).reshape(arr.shape)
    raw = b"".join(v.to_bytes(n_bits // 8, "little") for v in out)
    return np.frombuffer(raw, arr.dtype.newbyteorder("<")).reshape(arr.shape)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit (NaN payloads and -0.0 included)."""
    a = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<")))
    b = np.ascontiguousarray(b.astype(b.dtype.newbyteorder("<")))
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# ----------------------------------------------------------------------------- worked vectors

# (dtype, values, configuration, encoded bytes without padding byte, padding bits)
VECTORS: list[tuple[str, list[Any], dict[str, int], bytes, int]] = [
    # bool, 1 bit each: T F F T F -> bits 1,0,0,1,0 + 3 zero bits -> 0b00001001
    ("bool", [True, False, False, True, False], {}, b"\x09", 3),
    # eight bits fill one byte exactly: no padding
    ("bool", [True] * 8 + [False, True], {}, b"\xff\x02", 6),
    # uint8 high nibbles (bits 4..7): 0x12 0x34 0x56 -> 1, 3, 5 -> 0x31, 0x05
    ("uint8", [0x12, 0x34, 0x56], {"first_bit": 4, "last_bit": 7}, b"\x31\x05", 4),
    # int8 as int4 (bits 0..3): -1 2 -8 7 -> 0xF 0x2 0x8 0x7 -> 0x2F 0x78
    ("int8", [-1, 2, -8, 7], {"last_bit": 3}, b"\x2f\x78", 0),
    # int16, bits 2..13 (k=12): -4 -> 0xFFF, 20 -> 5 -> FF 5F 00
    ("int16", [-4, 20], {"first_bit": 2, "last_bit": 13}, b"\xff\x5f\x00", 0),
    # every bit of uint16: exactly the bytes codec's little-endian bytes
    ("uint16", [0x0102, 0xA0B0], {}, b"\x02\x01\xb0\xa0", 0),
    # complex64, top 16 bits of each float32 component: 1.0 = 0x3F800000, 2.0 = 0x40000000
    ("complex64", [1 + 2j], {"first_bit": 16}, b"\x80\x3f\x00\x40", 0),
    # uint32, 3 bits (bits 1..3) of 5 values: 2,4,6,8,14 -> 1,2,3,4,7 -> 15 bits + 1 pad
    ("uint32", [2, 4, 6, 8, 14], {"first_bit": 1, "last_bit": 3}, b"\xd1\x78", 1),
]


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize(("dtype", "values", "config", "body", "pad"), VECTORS)
def test_worked_vectors(
    dtype: str, values: list[Any], config: dict[str, int], body: bytes, pad: int, padding: str
) -> None:
    codec = PackBitsCodec(padding_encoding=padding, **config)
    arr = np.array(values, dtype=dtype)
    expected = {"none": body, "first_byte": bytes([pad]) + body, "last_byte": body + bytes([pad])}
    assert codec.encode_array(arr) == expected[padding]
    assert reference_encode(arr, padding, config.get("first_bit"), config.get("last_bit")) == (
        expected[padding]
    )
    decoded = codec.decode_bytes(expected[padding], arr.dtype, arr.shape)
    # the dropped bits come back zero (uint8 high nibbles: 0x12 -> 0x10)
    assert same_bits(decoded, reference_decoded(arr, config.get("first_bit"), config.get("last_bit")))
    if dtype != "uint8":
        assert same_bits(decoded, arr)  # every other vector is representable as it is


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bool"])
def test_all_bits_is_the_bytes_codec(dtype: str) -> None:
    """Spec: full-width byte-sized types are 'encoded using their little-endian representation'."""
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=7 * 5 * np.dtype(dtype).itemsize, dtype=np.uint8)
    arr = raw.view(np.dtype(dtype).newbyteorder("<")).reshape(7, 5)
    assert PackBitsCodec().encode_array(arr) == raw.tobytes()
    big = arr.astype(arr.dtype.newbyteorder(">"))  # byte order of the input does not matter
    assert PackBitsCodec().encode_array(big) == raw.tobytes()


@pytest.mark.parametrize("n", [1, 7, 8, 9, 40, 1000])
def test_bool_first_byte_matches_numcodecs_up_to_bit_order(n: int) -> None:
    """The spec's numcodecs compatibility: same padding byte, same bytes, bits in the other order.

    numcodecs packs most-significant bit first (numpy's default); the spec numbers bits from
    the least significant, as zarrs does. Only the order inside each byte differs.
    """
    arr = np.random.default_rng(n).integers(0, 2, size=n).astype(bool)
    ours = PackBitsCodec(padding_encoding="first_byte").encode_array(arr)
    theirs = numcodecs.PackBits().encode(arr)
    assert len(ours) == len(theirs) and ours[0] == theirs[0]
    reversed_bits = bytes(int(f"{b:08b}"[::-1], 2) for b in theirs[1:])
    assert ours[1:] == reversed_bits


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("last_bit", range(11, 15))
@pytest.mark.parametrize("first_bit", range(4))
def test_zarrs_int16_grid(first_bit: int, last_bit: int, padding: str) -> None:
    """zarrs' codec_packbits_int16 test: (-20..20) << first_bit, chunk 8x5, round trips."""
    codec = PackBitsCodec(padding_encoding=padding, first_bit=first_bit, last_bit=last_bit)
    arr = (np.arange(-20, 20, dtype=np.int16) << first_bit).reshape(8, 5)
    encoded = codec.encode_array(arr)
    assert len(encoded) == -(-40 * (last_bit - first_bit + 1) // 8) + (padding != "none")
    assert encoded == reference_encode(arr, padding, first_bit, last_bit)
    np.testing.assert_array_equal(codec.decode_bytes(encoded, arr.dtype, arr.shape), arr)


# ----------------------------------------------------------------------------- properties


@st.composite
def arrays_and_codecs(draw: st.DrawFn) -> tuple[np.ndarray, PackBitsCodec]:
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    n_bits, _, _ = component_layout(dtype)
    first = draw(st.none() | st.integers(0, n_bits - 1))
    last = draw(st.none() | st.integers(0 if first is None else first, n_bits - 1))
    padding = draw(st.sampled_from(PADDINGS))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    n = int(np.prod(shape))
    raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
    if dtype.kind == "b":
        arr = (np.frombuffer(raw, np.uint8) & 1).astype(bool).reshape(shape)
    else:
        arr = np.frombuffer(raw, dtype.newbyteorder("<")).reshape(shape)
    return arr, PackBitsCodec(padding_encoding=padding, first_bit=first, last_bit=last)


@settings(max_examples=300, deadline=None)
@given(arrays_and_codecs())
def test_property_encode_matches_spec_and_length_formula(case: tuple[np.ndarray, PackBitsCodec]) -> None:
    arr, codec = case
    encoded = codec.encode_array(arr)
    assert encoded == reference_encode(arr, codec.padding_encoding, codec.first_bit, codec.last_bit)
    n_bits, n_comp, _ = component_layout(arr.dtype)
    first = codec.first_bit or 0
    last = n_bits - 1 if codec.last_bit is None else codec.last_bit
    k = n_comp * (last - first + 1)
    assert len(encoded) == (arr.size * k + 7) // 8 + (codec.padding_encoding != "none")
    decoded = codec.decode_bytes(encoded, arr.dtype, arr.shape)
    assert same_bits(decoded, reference_decoded(arr, codec.first_bit, codec.last_bit))


@settings(max_examples=300, deadline=None)
@given(arrays_and_codecs())
def test_property_identity_on_representable_values(case: tuple[np.ndarray, PackBitsCodec]) -> None:
    arr, codec = case
    representable = reference_decoded(arr, codec.first_bit, codec.last_bit)
    decoded = codec.decode_bytes(codec.encode_array(representable), arr.dtype, arr.shape)
    assert same_bits(decoded, representable)


def test_large_chunk_crosses_blocks() -> None:
    """More components than one internal block: blocks must join on byte boundaries."""
    codec = PackBitsCodec(padding_encoding="last_byte", first_bit=0, last_bit=4)
    arr = np.random.default_rng(3).integers(-16, 16, size=(700, 401), dtype=np.int32)
    encoded = codec.encode_array(arr)
    assert len(encoded) == -(-arr.size * 5 // 8) + 1
    np.testing.assert_array_equal(codec.decode_bytes(encoded, arr.dtype, arr.shape), arr)
    small = arr[:3, :5]  # agrees with the oracle on a slice's worth of bits
    assert codec.encode_array(small) == reference_encode(small, "last_byte", 0, 4)


# ----------------------------------------------------------------------------- through zarr


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_zarr_array_round_trip(tmp_path: Path, dtype: str, padding: str) -> None:
    n_bits, _, _ = component_layout(np.dtype(dtype))
    config: dict[str, Any] = {"padding_encoding": padding}
    if n_bits >= 8 and np.dtype(dtype).kind in "iu":
        config |= {"first_bit": 1, "last_bit": n_bits - 2}
    codec = PackBitsCodec(**config)
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=13 * 9 * np.dtype(dtype).itemsize, dtype=np.uint8)
    data = raw.view(np.uint8 if dtype == "bool" else dtype).reshape(13, 9)
    if dtype == "bool":
        data = (data & 1).astype(bool)
    data = reference_decoded(data, codec.first_bit, codec.last_bit).astype(dtype)
    a = zarr.create_array(
        LocalStore(tmp_path / "a.zarr"), shape=(13, 9), chunks=(4, 4), dtype=dtype,
        serializer=codec.to_dict(), compressors=None, fill_value=0,
    )
    a[...] = data
    back = zarr.open_array(str(tmp_path / "a.zarr"))
    assert same_bits(back[...], data)
    stored = (tmp_path / "a.zarr" / "c" / "1" / "1").read_bytes()
    assert stored == reference_encode(data[4:8, 4:8], padding, codec.first_bit, codec.last_bit)
    assert len(stored) == codec.encoded_nbytes(16, np.dtype(dtype))
    doc = json.loads((tmp_path / "a.zarr" / "zarr.json").read_text())
    assert doc["codecs"][0] == codec.to_dict()


def test_corrupt_chunks_are_refused(tmp_path: Path) -> None:
    codec = PackBitsCodec(padding_encoding="first_byte")
    arr = np.array([True, False, True], dtype=bool)
    good = codec.encode_array(arr)
    assert good == b"\x05\x05"
    with pytest.raises(CorruptDataError, match="padding byte says 4 padding bits.*need 5"):
        codec.decode_bytes(b"\x04\x05", arr.dtype, arr.shape)
    with pytest.raises(CorruptDataError, match="3 bytes, expected 2"):
        codec.decode_bytes(good + b"\x00", arr.dtype, arr.shape)
    with pytest.raises(CorruptDataError, match="1 bytes, expected 2"):
        codec.decode_bytes(good[:1], arr.dtype, arr.shape)
    # through zarr: the error reaches the reader, not a wrong array
    a = zarr.create_array(LocalStore(tmp_path / "b.zarr"), shape=(3,), chunks=(3,), dtype=bool,
                          serializer=codec.to_dict(), compressors=None, fill_value=False)
    a[...] = arr
    (tmp_path / "b.zarr" / "c" / "0").write_bytes(b"\x05")
    with pytest.raises(CorruptDataError):
        zarr.open_array(str(tmp_path / "b.zarr"))[...]


def test_metadata_round_trip_and_aliases() -> None:
    assert PackBitsCodec.from_dict({"name": "packbits"}).to_dict() == {"name": "packbits"}
    full = {"name": "packbits",
            "configuration": {"padding_encoding": "last_byte", "first_bit": 2, "last_bit": 9}}
    assert PackBitsCodec.from_dict(full).to_dict() == full
    nulls = {"name": "packbits",
             "configuration": {"padding_encoding": "none", "first_bit": None, "last_bit": None}}
    assert PackBitsCodec.from_dict(nulls) == PackBitsCodec()
    # the spec's schema.json spelling (an older revision) reads as the README's
    old = {"name": "packbits",
           "configuration": {"padding_encoding": "start_byte", "start_bit": 1, "end_bit": 3}}
    assert PackBitsCodec.from_dict(old) == PackBitsCodec(
        padding_encoding="first_byte", first_bit=1, last_bit=3
    )
    assert PackBitsCodec.from_dict(
        {"name": "packbits", "configuration": {"padding_encoding": "end_byte"}}
    ).padding_encoding == "last_byte"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"padding_encoding": "middle"}, "'padding_encoding' must be one of"),
        ({"first_bit": 5, "last_bit": 4}, r"'last_bit' \(4\) must not be less than 'first_bit' \(5\)"),
        ({"first_bit": -1}, "'first_bit' must be an integer >= 0"),
        ({"last_bit": True}, "'last_bit' must be an integer >= 0"),
        ({"bits": 3}, r"unknown configuration keys \['bits'\]"),
        ({"first_bit": 1, "start_bit": 1}, "not both"),
    ],
)
def test_bad_configuration(config: dict[str, Any], message: str) -> None:
    with pytest.raises(MetadataError, match=message):
        PackBitsCodec.from_dict({"name": "packbits", "configuration": config})


def test_bits_outside_the_data_type_refused_when_the_array_is_made() -> None:
    with pytest.raises(MetadataError, match="last_bit must be at most 7"):
        zarr.create_array(MemoryStore(), shape=(4,), dtype="uint8", fill_value=0,
                          serializer={"name": "packbits", "configuration": {"last_bit": 8}})
    with pytest.raises(MetadataError, match="do not fit the 1-bit components of bool"):
        zarr.create_array(MemoryStore(), shape=(4,), dtype="bool", fill_value=False,
                          serializer={"name": "packbits", "configuration": {"first_bit": 1}})
    with pytest.raises(MetadataError, match="data type <U.*not supported.*use the 'bytes' codec"):
        PackBitsCodec().encode_array(np.array(["a"]))


# ----------------------------------------------------------------------------- entry point

FRESH_INTERPRETER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    import numpy as np
    import zarr

    root = Path(sys.argv[1])
    meta = {
        "zarr_format": 3, "node_type": "array", "shape": [2, 5], "data_type": "bool",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 5]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": False,
        "codecs": [{"name": "packbits", "configuration": {"padding_encoding": "last_byte"}}],
    }
    (root / "zarr.json").write_text(json.dumps(meta))
    (root / "c" / "0").mkdir(parents=True)
    # T F F T F / F T F F T -> bits 1001001001 + 6 zero bits -> 0x49 0x02, then padding 6
    (root / "c" / "0" / "0").write_bytes(bytes([0x49, 0x02, 6]))
    assert "zfuse" not in sys.modules
    arr = zarr.open_array(str(root), mode="r+")
    assert arr[...].tolist() == [[True, False, False, True, False],
                                 [False, True, False, False, True]], arr[...]
    assert type(arr.metadata.codecs[0]).__module__ == "zfuse.ext.packbits"
    arr[1, :] = True
    assert (root / "c" / "0" / "0").read_bytes() == bytes([0xE9, 0x03, 6])
    print("ok")
    """
)


def test_plain_zarr_finds_packbits_in_a_fresh_interpreter(tmp_path: Path) -> None:
    from importlib.metadata import entry_points

    assert "packbits" in {e.name for e in entry_points(group="zarr.codecs")}
    result = subprocess.run(
        [sys.executable, "-c", FRESH_INTERPRETER, str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
