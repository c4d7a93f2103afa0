"""Opening a store's hierarchy one member at a time, so one bad array never hides the rest.

zarr-python's ``Group.members()`` opens every member in a task of its own and
fails as a whole when one member's metadata cannot be parsed; the other
tasks' exceptions are then never retrieved (asyncio prints each one). Here
each member is opened on its own, with bounded concurrency, and every
exception is caught and kept with the member's name. A member that cannot be
opened is described by its stored metadata document and a reason from
`unsupported_reason`, the one place where a cause is put into words.

Consolidated metadata is used as zarr-python uses it: a group whose
consolidated metadata parses lists (and opens) its members from there; one
whose consolidated metadata zarr-python cannot parse is opened again from
each member's own metadata, so a bad entry there hides nothing either.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import logging
import os
import re
import warnings
from typing import Any

import numpy as np
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from zfuse import defaults
from zfuse.errors import CorruptDataError, MetadataError
from zfuse.ext import zarr_private
from zfuse.ext.metadata_json import load_metadata
from zfuse.view.codec_packages import register_imagecodecs

log = logging.getLogger("zfuse.view")

# names in a group's listing that are metadata objects, never members
_METADATA_OBJECTS = frozenset({"zarr.json", ".zgroup", ".zattrs", ".zarray", ".zmetadata"})
_OPEN_CONCURRENCY = 16
# names of a group's listing kept at most (a store of millions of objects in one group
# would otherwise cost the memory of every name, before any is shown)
MEMBER_NAMES_MAX = 1_000_000

Member = zarr.Array | zarr.Group | BaseException


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def _raw_store(store: Any) -> Any:
    """The store as written (below zfuse's transformer wrapper, which edits zarr.json)."""
    return getattr(store, "raw_store", store)


async def _get_json(store: Any, key: str) -> Any:
    try:
        buf = await store.get(key, prototype=default_buffer_prototype())
    except CorruptDataError as exc:  # (a server sending more than a document can be: not read)
        return {"zfuse_unparsable": str(exc)}
    if buf is None:
        return None
    raw = buf.to_bytes()
    try:  # too large or too deep: never parsed; past zfuse's bounds: not opened
        return load_metadata(raw, key)
    except MetadataError as exc:
        return {"zfuse_unparsable": str(exc)}
    except ValueError as exc:
        return {"zfuse_unparsable": f"{key} is not JSON: {exc}"}


async def read_stored_metadata(store: Any, path: str) -> dict[str, Any] | None:
    """The node's metadata document as stored, or None where there is none.

    v3: ``zarr.json``. v2: ``.zarray`` or ``.zgroup`` with ``.zattrs`` as
    ``attributes`` (the form zarr-python 3 gives v2 metadata).
    """
    # the first thing opening a store does: imagecodecs' numcodecs codecs are known
    # before zarr-python parses a v2 compressor (once per process)
    register_imagecodecs()
    raw = _raw_store(store)
    doc = await _get_json(raw, _join(path, "zarr.json"))
    if isinstance(doc, dict):
        return doc
    # v2's three documents asked for at once: one round trip to a remote store, not three
    v2_array, v2_group, v2_attrs = await asyncio.gather(
        *(_get_json(raw, _join(path, name)) for name in (".zarray", ".zgroup", ".zattrs")))
    for name, doc in ((".zarray", v2_array), (".zgroup", v2_group)):
        if isinstance(doc, dict):
            attrs = v2_attrs
            out = dict(doc)
            out.setdefault("zarr_format", 2)
            if name == ".zgroup":
                out["node_type"] = "group"
            if isinstance(attrs, dict) and "zfuse_unparsable" in attrs:
                out["zfuse_unparsable"] = attrs["zfuse_unparsable"]  # the reason the node is not shown
            elif isinstance(attrs, dict) and attrs:
                out["attributes"] = attrs
            return out
    return None


def stored_metadata(store: Any, path: str) -> dict[str, Any] | None:
    return sync(read_stored_metadata(store, path))


def node_type_of(doc: dict[str, Any] | None) -> str | None:
    """"array", "group" or None, from a document `read_stored_metadata` returned."""
    if not isinstance(doc, dict):
        return None
    if doc.get("node_type") in ("array", "group"):
        return doc["node_type"]
    if doc.get("zarr_format") == 2 and "shape" in doc:
        return "array"
    return None


# -- one member at a time -------------------------------------------------------


def member_names(group: zarr.Group) -> list[str]:
    """The names a group's members may have, sorted: its consolidated metadata's, or
    its listing's (store I/O: one listing), metadata objects left out. Some may be no
    node (a stray object): `open_members` leaves those out."""
    return sync(_member_names(zarr_private.async_group(group)))


async def _note_unconsolidated(store_path: Any, names: list[str]) -> None:
    """Log members a local group holds that its consolidated metadata does not name
    (added after it was written): not shown, as zarr-python does not see them either,
    but said (an array added later was missing without a word). Local stores only:
    a listing of a remote group costs a round trip."""
    from zfuse.view.source import store_access

    if store_access(store_path.store).local is None:
        return
    known = set(names)
    later = []
    looked = 0
    async for name in store_path.store.list_dir(store_path.path):
        looked += 1
        if looked > MEMBER_NAMES_MAX:  # (as a listed group's names: a directory of a million strays)
            break
        name = name.rstrip("/")
        if name not in known and name not in _METADATA_OBJECTS and _is_file_name(name):
            prefix = f"{store_path.path}/{name}" if store_path.path else name
            for document in ("zarr.json", ".zarray", ".zgroup"):
                if await store_path.store.exists(f"{prefix}/{document}"):
                    later.append(name)
                    break
        if len(later) >= 1000:
            break
    if later:
        log.warning("group %r: %d member(s) not in its consolidated metadata, not shown (zarr-python does not "
                    "see them either), e.g. %r: consolidate it again (zarr.consolidate_metadata) to show them",
                    store_path.path or "/", len(later), later[0])


def open_members(group: zarr.Group, names: list[str]) -> list[tuple[str, Member]]:
    """(name, array | group | the exception opening it raised) for each of `names`, by
    name (store I/O: each one's metadata, side by side).

    Names that are not nodes (stray files, directories without metadata) are
    left out, as zarr-python leaves them out.
    """
    register_imagecodecs()  # a view built without `read_stored_metadata` (tests, tools)
    return sync(_members(zarr_private.async_group(group), names))


async def _member_names(group: Any) -> list[str]:
    consolidated = group.metadata.consolidated_metadata
    store_path = group.store_path
    if consolidated is not None:
        names = list(consolidated.metadata)
        await _note_unconsolidated(store_path, names)
    else:
        listed = []
        async for name in store_path.store.list_dir(store_path.path):
            if len(listed) == MEMBER_NAMES_MAX:
                log.warning("group %r lists more than %d names: the first %d are shown",
                            store_path.path or "/", MEMBER_NAMES_MAX, MEMBER_NAMES_MAX)
                break
            # (an http(s) directory page lists subdirectories as `a/`)
            listed.append(name[:-1] if name.endswith("/") else name)
        # (a read-write mount's probe object, listed if the listing was made meanwhile)
        names = [n for n in listed if n not in _METADATA_OBJECTS
                 and not n.startswith(defaults.CONDITIONS_PROBE_PREFIX)]
    bad = [n for n in names if not _is_file_name(n)]
    if bad:
        # an object store's keys may hold anything (`g/../x`, `g//x`): no directory entry
        # can be called that, and no key through it is read (the store refuses it)
        log.warning("group %r: %d member name(s) that are no file name not shown, e.g. %r",
                    store_path.path or "/", len(bad), bad[0])
        names = [n for n in names if _is_file_name(n)]
    if not store_path.path and defaults.CONTROL_DIR_NAME in names:
        # the mount's own directory is there: the member would be merged into it
        log.warning("member %r of the root group not shown: the name of zfuse's own directory",
                    defaults.CONTROL_DIR_NAME)
        names.remove(defaults.CONTROL_DIR_NAME)
    return sorted(names)


NAME_MAX = 255  # bytes of one name in a path (Linux): the kernel refuses a longer one in a listing


def _is_file_name(name: str) -> bool:
    if name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        return False
    try:
        # (longer than NAME_MAX bytes: the kernel fails the whole directory's listing with
        # EIO; a lone surrogate from a JSON listing has no bytes a directory entry can hold)
        return len(os.fsencode(name)) <= NAME_MAX
    except UnicodeEncodeError:
        return False


async def _members(group: Any, names: list[str]) -> list[tuple[str, Member]]:
    limit = asyncio.Semaphore(_OPEN_CONCURRENCY)

    async def one(name: str) -> tuple[str, Member | None]:
        # never raises: every exception is kept, none is left unretrieved
        async with limit:
            try:
                node = await group.getitem(name)
            except KeyError as exc:
                try:
                    if await _has_own_metadata(group, name):
                        # zarr-python reports a missing field (fill_value) as KeyError
                        return name, exc
                    return name, await _implicit_group(group, name)
                except Exception as again:  # (a lookup the store failed: this member's problem)
                    return name, again
            except Exception as exc:
                try:
                    return name, await _retry_without_consolidated(group, name, exc)
                except Exception as again:
                    return name, again
        if isinstance(node, zarr.AsyncGroup):
            return name, zarr.Group(node)
        try:
            check_codecs(node)
        except Exception as exc:
            return name, exc
        return name, zarr.Array(node)

    found = await asyncio.gather(*(one(name) for name in names))
    return [(name, member) for name, member in found if member is not None]


class ImplicitGroup(zarr.Group):
    """A directory without group metadata on the way to nodes (``A/`` of an
    OME-Zarr plate ``A/1/0``): zarr-python opens the arrays below it by path but
    does not list it. Shown as a group when something below it is shown."""


async def _has_own_metadata(group: Any, name: str) -> bool:
    """Whether `name` holds a node's own metadata document (so it is a node, readable or not)."""
    store_path = group.store_path / name
    for doc in ("zarr.json", ".zarray", ".zgroup"):
        key = f"{store_path.path}/{doc}" if store_path.path else doc
        if await store_path.store.exists(key):
            return True
    return False


async def _implicit_group(group: Any, name: str) -> ImplicitGroup | None:
    store_path = group.store_path / name
    async for _ in store_path.store.list_dir(store_path.path):
        break
    else:
        return None  # a stray object, not a directory
    from zarr.core.group import GroupMetadata

    metadata = GroupMetadata(zarr_format=group.metadata.zarr_format)
    return ImplicitGroup(zarr.AsyncGroup(metadata=metadata, store_path=store_path))


def check_codecs(array: Any) -> None:
    """Load every codec the array's chunks need, so a missing codec package is
    found when the view is built, not at the first read: zarr-python loads
    the numcodecs codecs of v3 arrays lazily (``numcodecs.pcodec`` without the
    pcodec package opens fine and fails on every chunk)."""
    register_imagecodecs()
    metadata = array.metadata
    if metadata.zarr_format != 3:
        return  # v2 compressors and filters are loaded when the metadata is parsed
    pending = list(metadata.codecs)
    while pending:
        codec = pending.pop()
        zarr_private.load_numcodecs_codec(codec)
        pending += list(getattr(codec, "codecs", ()) or ()) + list(getattr(codec, "index_codecs", ()) or ())


async def _retry_without_consolidated(group: Any, name: str, exc: Exception) -> Member:
    """A subgroup whose consolidated metadata zarr-python cannot parse: open it from
    its members' own metadata instead (what `use_consolidated=False` does)."""
    path = _join(group.store_path.path, name)
    doc = await read_stored_metadata(group.store_path.store, path)
    if node_type_of(doc) != "group" or not _has_consolidated(doc):
        return exc
    try:
        sub = await zarr.AsyncGroup.open(
            group.store_path / name, zarr_format=None, use_consolidated=False
        )
    except Exception:
        return exc
    log.warning("group %r: consolidated metadata unusable (%s); reading each member's own metadata",
                path, _short(exc))
    return zarr.Group(sub)


def _has_consolidated(doc: dict[str, Any] | None) -> bool:
    return isinstance(doc, dict) and (doc.get("zarr_format") == 2 or bool(doc.get("consolidated_metadata")))


def open_root_group(open_group: Any, store: Any) -> zarr.Group:
    """`open_group(store)`, and once more without consolidated metadata when that fails."""
    register_imagecodecs()
    try:
        return open_group(store)
    except Exception as first:
        try:
            group = open_group(store, use_consolidated=False)
        except Exception:
            raise first from None
        log.warning("consolidated metadata unusable (%s); reading each member's own metadata", _short(first))
        return group


# -- the reason a node is not shown ----------------------------------------------


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_UNKNOWN_DTYPE = re.compile(r"No Zarr data type found that matches (.+)$")
_UNKNOWN_CODEC = re.compile(r"(?:Unknown codec|codec not available):\s*'*([^']+?)'*\s*$")


def unsupported_reason(path: str, exc: BaseException | str, metadata: dict[str, Any] | None) -> str:
    """Why the node at `path` is not shown, naming the path and the cause.

    `exc` is what opening it raised (or the cause already in words, e.g. a
    dtype TIFF cannot hold); `metadata` its stored document (for the data
    type, codec or field the cause lies in). The message never depends on
    which internal wrapper raised.
    """
    where = f"array {path!r}" if node_type_of(metadata) != "group" else f"group {path!r}"
    if isinstance(exc, str):
        return f"{where}: {exc}"
    cause = _cause(exc, metadata or {})
    if cause.startswith(("array ", "group ")):
        return cause  # the validator's message names the node already
    return f"{where}: {cause}"


def _cause(exc: BaseException, doc: dict[str, Any]) -> str:
    text = " ".join(str(exc).split())
    if "zfuse_unparsable" in doc:
        return doc["zfuse_unparsable"]
    if type(exc).__module__.startswith("zfuse"):
        return str(exc)  # zfuse's own messages already name the field (and keep their lines)
    if _missing_v3_field(doc):
        invalid = _invalid_v3(doc)
        if invalid is not None:
            return invalid
    bad_field = _bad_field(doc) if doc else None
    if bad_field is not None:
        return bad_field
    match = _UNKNOWN_DTYPE.search(text)
    if match:
        return f"data type {match.group(1)} is not known to zarr-python"
    if type(exc).__name__ == "UnknownCodecError":
        codec = _UNKNOWN_CODEC.search(text)
        return _codec_problem(codec.group(1) if codec else "?", text)
    invalid = _invalid_v3(doc)  # structure: a missing field or codec, and the fix
    if invalid is not None:
        return invalid
    return f"zarr-python cannot open it: {_short(exc)}"


def _missing_v3_field(doc: dict[str, Any]) -> bool:
    from zfuse.ext.validate import REQUIRED_FIELDS

    return doc.get("zarr_format") == 3 and doc.get("node_type") == "array" and any(
        name not in doc for name in REQUIRED_FIELDS)


def _invalid_v3(doc: dict[str, Any]) -> str | None:
    """The validator's list of problems and fixes for v3 array metadata, if it has any."""
    from zfuse.ext.validate import validate_array_metadata

    try:
        validate_array_metadata(doc, "")
    except MetadataError as e:
        text = str(e)
        return text.split(": ", 1)[1] if text.startswith("array :") else text
    except Exception:  # the validator never decides alone; zarr's own error is next
        return None
    return None


def _json(value: Any) -> str:
    """A metadata value in a message: names quoted, a named configuration by its name."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        config = value.get("configuration")
        return repr(value["name"]) + (f" (configuration {json.dumps(config)})" if config else "")
    return json.dumps(value)


def _codec_problem(name: str, text: str) -> str:
    if "not available" in text:
        module = "numcodecs." + name.removeprefix("numcodecs.")
        try:
            known = importlib.util.find_spec(module) is not None  # numcodecs wraps a package
        except (ImportError, ValueError):
            known = False
        if known:
            return f"codec {name!r}: its Python package is not installed here ({module} cannot load it)"
        return f"codec {name!r} is not available here (no installed numcodecs codec has that id)"
    if "Unknown codec" in text or "not found" in text.lower():
        return f"codec {name!r} is not known to zarr-python"
    return f"codec {name!r}: {text}"


def _bad_field(doc: dict[str, Any]) -> str | None:
    """Which field of the document zarr-python rejects (data type, fill value,
    codec), found by parsing each on its own; None when each parses."""
    fmt = doc.get("zarr_format")
    if fmt not in (2, 3) or node_type_of(doc) != "array":
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's "numcodecs codecs are not in the spec"
        return _bad_data_type(doc, fmt) or _bad_codec(doc, fmt)


def _object_codec_id(doc: dict[str, Any]) -> str | None:
    for f in doc.get("filters") or ():
        if isinstance(f, dict) and isinstance(f.get("id"), str):
            return f["id"]
    return None


def _bad_data_type(doc: dict[str, Any], fmt: int) -> str | None:
    try:
        from zarr.core.dtype import get_data_type_from_json
    except ImportError:  # pragma: no cover - zarr moved it
        return None
    raw = doc.get("dtype") if fmt == 2 else doc.get("data_type")
    spec: Any = raw
    object_codec = _object_codec_id(doc) if fmt == 2 and raw == "|O" else None
    if fmt == 2:
        spec = {"name": raw, "object_codec_id": object_codec}
    try:
        dtype = get_data_type_from_json(spec, zarr_format=fmt)  # type: ignore[arg-type]
    except Exception:
        if raw == "|O":
            how = f"encoded by {object_codec!r}" if object_codec else "with no object codec"
            return f"data type '|O' (Python objects {how}) is not supported by zarr-python"
        return f"data type {_json(raw)} is not known to zarr-python"
    fill = doc.get("fill_value")
    if fill is None and fmt == 2:
        return None  # v2 allows null: missing chunks read as zeros
    try:
        dtype.from_json_scalar(fill, zarr_format=fmt)  # type: ignore[arg-type]
    except Exception as exc:
        return f"fill_value {_json(fill)} is not a value of data type {_json(raw)} ({' '.join(str(exc).split())})"
    return None


def _bad_codec(doc: dict[str, Any], fmt: int) -> str | None:
    if fmt == 2:
        import numcodecs

        configs = [doc.get("compressor"), *(doc.get("filters") or ())]
        for config in configs:
            if config is None:
                continue
            name = config.get("id", "?") if isinstance(config, dict) else repr(config)
            try:
                numcodecs.get_codec(dict(config))
            except Exception as exc:
                return _codec_problem(str(name), _short(exc))
        return None
    from zarr.registry import get_codec_class

    pending = list(doc.get("codecs") or ())
    while pending:
        config = pending.pop(0)
        name = config if isinstance(config, str) else (config or {}).get("name", "?")
        try:
            cls = get_codec_class(str(name))
        except Exception as exc:
            return _codec_problem(str(name), "Unknown codec" if isinstance(exc, KeyError) else _short(exc))
        try:
            codec = cls.from_dict(config) if isinstance(config, dict) else cls()  # type: ignore[attr-defined]
            zarr_private.load_numcodecs_codec(codec)  # numcodecs codecs load lazily: load it now
        except Exception as exc:
            return _codec_problem(str(name), _short(exc))
        if isinstance(config, dict):
            inner = (config.get("configuration") or {})
            pending += list(inner.get("codecs") or ()) + list(inner.get("index_codecs") or ())
    return None


def json_default(value: Any) -> Any:
    """JSON for what zarr attributes and metadata documents hold besides JSON types."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def unsupported_metadata(doc: dict[str, Any] | None, reason: str) -> bytes:
    """The zarr.json of a node shown without chunk files: its own metadata
    document with the reason in ``attributes.zfuse.unsupported``."""
    meta = dict(doc or {})
    meta["attributes"] = dict(meta.get("attributes") or {})
    meta["attributes"]["zfuse"] = {"unsupported": reason}
    return json.dumps(meta, indent=2, default=json_default).encode()
