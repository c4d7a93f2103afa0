"""Check a Zarr v3 array's ``zarr.json`` before zarr-python sees it, and say how to fix it.

zarr-python 3.1 reports broken metadata as whatever its parser trips on first: a bare
``KeyError: 'fill_value'``, "At least one ArrayBytesCodec is required.", "Named
configuration does not have a 'configuration' key". :func:`validate_array_metadata`
finds every problem of a document at once and raises one
:class:`~zfuse.errors.MetadataError` whose message names the array, then one line per
problem: the field, what is wrong, and the smallest change that fixes it.

Invariants:

- Only documents with ``"zarr_format": 3`` and ``"node_type": "array"`` are checked;
  anything else (groups, v2 metadata) passes untouched.
- Checked: required fields present (``fill_value`` among them); ``data_type`` known to
  zarr-python; every codec name registered (entry points included), nested
  ``sharding_indexed`` codec lists too; exactly one array-to-bytes codec, after the
  array-to-array and before the bytes-to-bytes ones; each codec's configuration accepted
  by its class; ``chunk_key_encoding`` parseable; every storage transformer one zfuse
  implements, with a valid configuration. When all of that holds, the document (without
  ``storage_transformers``, which zarr-python does not accept) must also pass zarr-python's
  own parser; its complaint, if any, is reported with the array named.
- A document that passes is opened by zarr-python exactly as it would have been without
  this check: nothing is rewritten.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec

from zfuse.errors import MetadataError

__all__ = ["validate_array_metadata"]

REQUIRED_FIELDS = ("shape", "data_type", "chunk_grid", "chunk_key_encoding", "fill_value", "codecs")

# What to write for a codec whose JSON has no "configuration" although zarr-python needs one:
# the codec's own defaults in zarr-python 3.1.
CONFIGURATION_EXAMPLES: dict[str, dict[str, Any]] = {
    "zstd": {"level": 0, "checksum": False},
    "gzip": {"level": 5},
    "blosc": {"cname": "zstd", "clevel": 5, "shuffle": "shuffle", "blocksize": 0},
}

BYTES_CODEC = {"name": "bytes", "configuration": {"endian": "little"}}


def _js(value: Any) -> str:
    return json.dumps(value)


def _fill_value_example(data_type: object) -> str:
    if not isinstance(data_type, str):
        return "0"
    if data_type == "bool":
        return "false"
    if data_type.startswith("complex"):
        return "[0.0, 0.0]"
    if data_type.startswith("float"):
        return '0.0 (or "NaN")'
    if data_type in ("string", "fixed_length_utf32"):
        return '""'
    return "0"


def _known_codec_names() -> list[str]:
    """Every codec name zarr-python can resolve (entry points included), for messages."""
    import zarr.registry as registry

    names: list[str] = []
    registries = getattr(registry, "__codec_registries", None)
    if isinstance(registries, dict):
        for name, reg in registries.items():
            try:
                reg.lazy_load()
            except Exception:  # a broken third-party entry point must not hide the rest
                continue
            if reg:
                names.append(name)
    return sorted(names)


def _codec_kind(cls: type) -> str:
    if issubclass(cls, ArrayArrayCodec):
        return "array-to-array"
    if issubclass(cls, ArrayBytesCodec):
        return "array-to-bytes"
    if issubclass(cls, BytesBytesCodec):
        return "bytes-to-bytes"
    return "unknown"


_ORDER = {"array-to-array": 0, "array-to-bytes": 1, "bytes-to-bytes": 2}


def _check_codecs(codecs: object, field: str, problems: list[str]) -> None:
    """Append to ``problems`` what is wrong with one codec list (recursing into sharding)."""
    if not isinstance(codecs, list):
        problems.append(
            f"{field}: must be a list of codec objects, e.g. [{_js(BYTES_CODEC)}]. Got {codecs!r}"
        )
        return
    from zarr.registry import get_codec_class

    kinds: list[tuple[int, str, str]] = []  # (index, name, kind) of every codec understood
    for i, codec in enumerate(codecs):
        where = f"{field}[{i}]"
        if isinstance(codec, str):
            codec = {"name": codec}
        if not isinstance(codec, dict) or not isinstance(codec.get("name"), str):
            problems.append(f'{where}: a codec must be an object with a "name". Got {codec!r}')
            continue
        name = codec["name"]
        try:
            cls = get_codec_class(name)
        except KeyError:
            problems.append(
                f"{where}: unknown codec {name!r}. zarr-python with zfuse knows "
                f"{', '.join(_known_codec_names())}; use one of those, or install the package that "
                f"registers {name!r} (a 'zarr.codecs' entry point)"
            )
            continue
        kind = _codec_kind(cls)
        kinds.append((i, name, kind))
        if "configuration" not in codec and name in CONFIGURATION_EXAMPLES:
            problems.append(
                f'{where} ({name!r}): "configuration" is missing and zarr-python requires it. '
                f'Add "configuration": {_js(CONFIGURATION_EXAMPLES[name])}'
            )
            continue
        config = codec.get("configuration")
        if name == "sharding_indexed" and isinstance(config, dict):
            # the inner lists first: their problems are named precisely there
            before = len(problems)
            _check_codecs(config.get("codecs"), f"{where}.configuration.codecs", problems)
            if "index_codecs" in config:
                _check_codecs(
                    config.get("index_codecs"), f"{where}.configuration.index_codecs", problems
                )
            if len(problems) > before:
                continue
        refused = _zarr_refusal(cls.from_dict, codec)
        if refused is not None:
            problems.append(f"{where} ({name!r}): invalid configuration: {refused}")

    array_bytes = [(i, n) for i, n, k in kinds if k == "array-to-bytes"]
    if len(kinds) == len(codecs) and not array_bytes:
        first_bb = next((n for _, n, k in kinds if k == "bytes-to-bytes"), None)
        before = f" before {first_bb!r}" if first_bb else ""
        what = "; ".join(
            f"{' and '.join(repr(n) for _, n, k in kinds if k == kind)} "
            f"{'is' if sum(k == kind for _, _, k in kinds) == 1 else 'are'} {kind}"
            for kind in ("array-to-array", "bytes-to-bytes")
            if any(k == kind for _, _, k in kinds)
        )
        problems.append(
            f"{field}: no array-to-bytes codec{f' ({what})' if what else ''}; a codec list "
            f"needs exactly one to turn the array into bytes. Add {_js(BYTES_CODEC)}{before}"
        )
    elif len(array_bytes) > 1:
        problems.append(
            f"{field}: {len(array_bytes)} array-to-bytes codecs "
            f"({', '.join(repr(n) for _, n in array_bytes)}); keep exactly one"
        )
    order = [(_ORDER[k], i, n) for i, n, k in kinds if k in _ORDER]
    for (o1, i1, n1), (o2, i2, n2) in zip(order, order[1:], strict=False):
        if o2 < o1:
            problems.append(
                f"{field}: {n2!r} ({field}[{i2}]) must come before {n1!r} ({field}[{i1}]): "
                "codecs run array-to-array, then the one array-to-bytes, then bytes-to-bytes"
            )
            break


def _check_transformers(doc: dict[str, Any], problems: list[str]) -> None:
    from zfuse.ext.concat_parts import parse_concat_parts
    from zfuse.ext.sharding_v1 import parse_sharding_v1
    from zfuse.ext.stack import transformer_kind

    transformers = doc.get("storage_transformers")
    if transformers is None:
        return
    if not isinstance(transformers, list):
        problems.append(f"storage_transformers: must be a list. Got {transformers!r}")
        return
    rank = len(doc["shape"]) if isinstance(doc.get("shape"), list) else None
    for i, t in enumerate(transformers):
        field = f"storage_transformers[{i}]"
        try:
            kind = transformer_kind(t, i)
            if kind == "concat-parts":
                parse_concat_parts(t, field=field)
            elif rank is not None:
                parse_sharding_v1(t, rank, field=field)
        except MetadataError as e:
            text = str(e)
            if "unknown storage transformer" in text:
                text += "; remove it, or open the array with a tool that implements it"
            problems.append(text if text.startswith(field) else f"{field}: {text}")



def _zarr_refusal(parse: Any, value: Any) -> Exception | None:
    """What zarr-python raises parsing `value` (None: it accepts it). Its warnings are
    silenced: zarr warns again when it opens the array; once is enough."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parse(value)
    except Exception as e:
        return e
    return None

def validate_array_metadata(doc: object, where: str) -> None:
    """Raise MetadataError listing every problem of a v3 array ``zarr.json`` and its fix.

    ``where`` names the array in the message (a store URL plus path, or a mount path).
    Documents that are not v3 array metadata are accepted untouched.
    """
    if not isinstance(doc, dict) or doc.get("zarr_format") != 3 or doc.get("node_type") != "array":
        return
    problems: list[str] = []
    for name in REQUIRED_FIELDS:
        if name not in doc:
            if name == "fill_value":
                problems.append(
                    f'fill_value: missing (the value of chunks never written). Add "fill_value": '
                    f"{_fill_value_example(doc.get('data_type'))}"
                )
            elif name == "codecs":
                problems.append(f'codecs: missing. Add "codecs": [{_js(BYTES_CODEC)}]')
            elif name == "chunk_key_encoding":
                problems.append(
                    'chunk_key_encoding: missing. Add "chunk_key_encoding": {"name": "default"}'
                )
            else:
                problems.append(f"{name}: missing; Zarr v3 array metadata requires it")

    data_type = doc.get("data_type")
    if "data_type" in doc:
        from zarr.core.dtype import data_type_registry, get_data_type_from_json

        try:
            get_data_type_from_json(data_type, zarr_format=3)  # type: ignore[arg-type]
        except Exception:
            known = sorted(
                {getattr(c, "_zarr_v3_name", "") for c in data_type_registry.contents.values()}
                - {""}
            )
            problems.append(
                f"data_type: {data_type!r} is not a data type zarr-python 3.1 knows. "
                f"Use one of {', '.join(known)}"
            )

    if "codecs" in doc:
        _check_codecs(doc["codecs"], "codecs", problems)
    if "chunk_key_encoding" in doc:
        from zfuse.ext.chunk_keys import chunk_key_encoding_of

        try:
            chunk_key_encoding_of(doc)
        except MetadataError as e:
            problems.append(f'{e}. Use e.g. {{"name": "default"}}')
    _check_transformers(doc, problems)

    if not problems:
        # Whatever else zarr-python objects to (bad fill_value for the type, chunk shape
        # rank, sharding shapes...), reported with the array named.
        from zarr.core.metadata.v3 import ArrayV3Metadata

        present = {k: v for k, v in doc.items() if k != "storage_transformers"}
        refused = _zarr_refusal(ArrayV3Metadata.from_dict, present)
        if refused is not None:
            problems.append(f"zarr-python refuses it: {type(refused).__name__}: {refused}")

    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise MetadataError(
            f"array {where}: zarr.json is not valid Zarr v3 array metadata "
            f"({len(problems)} problem{'s' if len(problems) > 1 else ''}):\n{lines}"
        )
