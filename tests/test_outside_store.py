"""Nothing outside the store is read through a mount, and leftovers of a crashed writer.

Store layer (plain calls, no FUSE): every key is opened inside the store's directory
(`AtomicLocalStore.open_key`, openat2 RESOLVE_BENEATH, or a walk with O_NOFOLLOW where
the kernel has no openat2): a symbolic link leading out of the store, a symlinked
directory leading out, a key with `..`, a `suffix` chunk key encoding that would make
such keys, and an OME dataset path with `..` never reach a file outside. Links that
stay inside are followed. zfuse's own temporary files (`.NAME.XXXXXXXX.tmp`) are never
listed, and those older than the daemon are removed when their directory is listed.

Mounts: a root daemon mounted `-o ro,allow_other` and another user reading through it
gets EIO for the chunk that is a link to a root-only file, never its bytes, and reads
the store's own chunks; the whole-image file has no outside byte either.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import cpu, default_buffer_prototype

from zfuse import local_store
from zfuse.daemon import MountConfig
from zfuse.errors import CorruptDataError, MetadataError, OutsideStoreError
from zfuse.local_store import AtomicLocalStore, check_key
from zfuse.open_view import make_view
from zfuse.stats import Stats
from zfuse.store import MeteredStore
from zfuse.testing import Mounts

SECRET = b"TOPSECRET-0600!!"  # 16 bytes: exactly one 4x4 uint8 chunk, so it would pass through


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of opening inside the store: openat2, and the O_NOFOLLOW walk of kernels
    without it (which follows no link at all)."""
    if request.param == "openat2":
        if local_store._openat2 is None:
            pytest.skip("this kernel has no openat2")
    else:
        monkeypatch.setattr(local_store, "_openat2", None)
    return str(request.param)


def _private(tmp_path: Path) -> Path:
    """A root-only directory (0700) holding a root-only secret (0600), outside the store."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "secret").write_bytes(SECRET)
    (private / "secret").chmod(0o600)
    (private / "dir").mkdir()
    for name in ("0", "1"):
        (private / "dir" / name).write_bytes(SECRET)
    return private


# -- the store layer ---------------------------------------------------------------------


def test_keys_that_could_leave_the_store_are_refused() -> None:
    for key in ("../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", ".", "..", "a/", "a\x00b", "a\\..\\b"):
        with pytest.raises(OutsideStoreError):
            check_key(key)
    for key in ("zarr.json", "c/0/1", "a.b/.zarray", ".x.tmp", "c/0..1"):
        check_key(key)


def test_a_link_out_of_the_store_is_not_followed(tmp_path: Path, resolver: str) -> None:
    """A chunk that is a symbolic link to a file outside (absolute or relative): reading
    it raises OutsideStoreError naming the key, on every read path of the store."""
    private = _private(tmp_path)
    root = tmp_path / "store"
    (root / "c" / "0").mkdir(parents=True)
    (root / "c" / "0" / "0").write_bytes(b"inside" * 3)
    (root / "c" / "0" / "1").symlink_to(private / "secret")
    (root / "c" / "0" / "2").symlink_to(Path("..", "..", "..", "private", "secret"))
    store = MeteredStore(AtomicLocalStore(str(root), read_only=True), Stats())
    proto = default_buffer_prototype()
    for key in ("c/0/1", "c/0/2"):
        with pytest.raises(OutsideStoreError, match=key):
            store.get_local(key)
        with pytest.raises(OutsideStoreError, match=key):
            store.get_local(key, (0, 4))
        for request in (None, RangeByteRequest(0, 4), OffsetByteRequest(2), SuffixByteRequest(4)):
            with pytest.raises(OutsideStoreError):
                zarr.core.sync.sync(store.get(key, proto, request))
        with pytest.raises(OutsideStoreError):
            zarr.core.sync.sync(store.get_partial_values(proto, [(key, None)]))
        with pytest.raises(OutsideStoreError):
            zarr.core.sync.sync(store.getsize(key))
        # the name is in the store: it exists (and its read fails, naming it)
        assert store.exists_local(key)
    assert store.get_local("c/0/0") == b"inside" * 3


def test_a_link_that_stays_inside_is_followed(tmp_path: Path, resolver: str) -> None:
    root = tmp_path / "store"
    (root / "c" / "0").mkdir(parents=True)
    (root / "c" / "0" / "0").write_bytes(b"deduplicated")
    (root / "c" / "0" / "1").symlink_to("0")
    store = MeteredStore(AtomicLocalStore(str(root), read_only=True), Stats())
    if resolver == "walk":  # without openat2 no link is followed at all
        with pytest.raises(OutsideStoreError):
            store.get_local("c/0/1")
        return
    assert store.get_local("c/0/1") == b"deduplicated"
    assert store.exists_local("c/0/1")


def test_a_directory_linked_out_of_the_store_is_neither_listed_nor_read(tmp_path: Path, resolver: str) -> None:
    private = _private(tmp_path)
    root = tmp_path / "store"
    (root / "c" / "0").mkdir(parents=True)
    (root / "c" / "0" / "0").write_bytes(b"inside")
    (root / "c" / "1").symlink_to(private / "dir")
    (root / "etc").symlink_to("/etc")
    local = AtomicLocalStore(str(root), read_only=True)
    store = MeteredStore(local, Stats())
    assert [n for page in store.list_dir_local("c/1/", 100) for n in page] == []
    assert [n for page in store.list_dir_local("etc/", 100) for n in page] == []
    assert sorted(n for page in store.list_dir_local("c/", 100) for n in page) == ["0", "1"]  # (the name only)

    async def collect(it: object) -> list[str]:
        return sorted([k async for k in it])  # type: ignore[attr-defined]

    assert zarr.core.sync.sync(collect(store.list_dir("c/1"))) == []
    assert zarr.core.sync.sync(collect(store.list_prefix("c/"))) == ["c/0/0"]
    assert zarr.core.sync.sync(collect(store.list())) == ["c/0/0"]
    assert not store.exists_local("c/1/0")
    with pytest.raises(OutsideStoreError):
        store.get_local("c/1/0")
    with pytest.raises(OutsideStoreError):
        store.get_local("etc/passwd")


def test_writes_never_go_through_a_link_out_of_the_store(tmp_path: Path, resolver: str) -> None:
    """A writable mount (root) must not create, replace or delete files outside either."""
    private = _private(tmp_path)
    root = tmp_path / "store"
    root.mkdir()
    (root / "c").symlink_to(private / "dir")
    (root / "k").symlink_to(private / "secret")
    store = AtomicLocalStore(str(root))
    with pytest.raises(OutsideStoreError):
        store.set_sync("c/0", cpu.Buffer.from_bytes(b"overwritten"))
    with pytest.raises(OutsideStoreError):
        store.set_sync("../escape", cpu.Buffer.from_bytes(b"x"))
    with pytest.raises(OutsideStoreError):
        zarr.core.sync.sync(store.delete("c/1"))
    # a link as the last component is replaced itself (as a rename would), not written through
    store.set_sync("k", cpu.Buffer.from_bytes(b"new object"))
    assert not (root / "k").is_symlink() and (root / "k").read_bytes() == b"new object"
    zarr.core.sync.sync(store.delete("k"))
    assert sorted(os.listdir(private / "dir")) == ["0", "1"]
    assert (private / "secret").read_bytes() == SECRET
    assert not (tmp_path / "escape").exists()


def test_a_fifo_chunk_is_refused_not_waited_on(tmp_path: Path) -> None:
    root = tmp_path / "store"
    (root / "c").mkdir(parents=True)
    os.mkfifo(root / "c" / "0")
    store = MeteredStore(AtomicLocalStore(str(root), read_only=True), Stats())
    with pytest.raises(OutsideStoreError, match="not a regular file"):
        store.get_local("c/0")


def test_a_socket_is_refused_and_crafted_sizes_are_never_allocated(tmp_path: Path) -> None:
    """A socket (open(2) says ENXIO) is refused as a FIFO is; a range a crafted index
    gives (2**40 bytes, an offset past 2**63) is clamped to the file; a whole object
    larger than its reader's bound (a sparse terabyte) is refused without reading."""
    import socket

    root = tmp_path / "store"
    (root / "c").mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "c" / "sock"))
        store = MeteredStore(AtomicLocalStore(str(root), read_only=True), Stats())
        with pytest.raises(OutsideStoreError, match="c/sock: not a regular file"):
            store.get_local("c/sock")
    (root / "c" / "small").write_bytes(b"0123456789")
    assert store.get_local("c/small", (4, 2**40)) == b"456789"
    assert store.get_local("c/small", (2**63 + 5, 2**64)) == b""
    with open(root / "c" / "sparse", "wb") as f:
        f.truncate(2**40)
    with pytest.raises(CorruptDataError, match="c/sparse: stored object of 1099511627776 bytes"):
        store.get_local("c/sparse", max_bytes=1 << 20)


def test_odd_chunk_files_and_sparse_terabytes_cost_nothing(tmp_path: Path) -> None:
    """[hostile-12] The view (no FUSE): a FIFO and a socket as chunks of a raw array fail their
    chunk and whole-image reads at once (the whole image's passthrough opened the FIFO
    blocking, and waited for a writer forever); a sparse terabyte as a zstd chunk is
    refused unread, naming its key."""
    import socket
    import threading

    root = tmp_path / "odd.zarr"
    zarr.open_group(str(root), mode="w")
    raw = zarr.create_array(str(root / "raw"), shape=(8, 8), chunks=(4, 4), dtype="u1",
                            compressors=None, fill_value=0)
    raw[...] = 1
    zstd = zarr.create_array(str(root / "zstd"), shape=(8, 8), chunks=(4, 4), dtype="u1", fill_value=0)
    zstd[...] = 1
    (root / "raw" / "c" / "0" / "0").unlink()
    os.mkfifo(root / "raw" / "c" / "0" / "0")
    (root / "raw" / "c" / "0" / "1").unlink()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "raw" / "c" / "0" / "1"))
        with open(root / "zstd" / "c" / "1" / "1", "wb") as f:
            f.truncate(2**40)
        view = make_view(MountConfig([str(root)], "/nonexistent", read_only=True))
        arrays = dict(view.arrays())
        for coords in ((0, 0), (0, 1)):
            # listed, so looked up too (ENOENT for a listed name confuses every tool): EIO on read
            assert view.entry(("raw", "c", str(coords[0]), f"{coords[1]}.tiff")) is not None
            with pytest.raises(OutsideStoreError, match=f"raw/c/{coords[0]}/{coords[1]}: not a regular file"):
                arrays[("raw",)].pixel_bytes(coords)
        with pytest.raises(CorruptDataError, match="zstd/c/1/1: stored object of 1099511627776 bytes"):
            arrays[("zstd",)].pixel_bytes((1, 1))
        assert bytes(arrays[("zstd",)].pixel_bytes((0, 0))) == b"\x01" * 16

        image = view.whole_images(("raw",))["image.ome.tif"]
        size = view.entry(("raw", "image.ome.tif")).size  # type: ignore[union-attr]
        failures: list[BaseException] = []

        def read_all() -> None:
            for offset in range(0, size, 1 << 16):
                try:
                    image.read(offset, 1 << 16)
                except CorruptDataError as e:
                    failures.append(e)

        reader = threading.Thread(target=read_all, daemon=True)
        reader.start()
        reader.join(60)
        if reader.is_alive():
            with open(root / "raw" / "c" / "0" / "0", "wb"):  # (lets the blocked open go)
                pass
            pytest.fail("reading the whole image waited on the FIFO chunk")
        assert failures and all("not a regular file" in str(e) for e in failures), failures


def test_links_to_a_directory_above_are_not_listed(tmp_path: Path) -> None:
    """[hostile-13] Two links to the store's root (`a -> .`, `b -> .`) made a hierarchy doubling at
    every level, 2**64 directories at the depth shown, that `find` never finished; a
    link to the group it is in, or to one above, is not listed. A link to a sibling
    (no cycle) still is."""
    root = tmp_path / "cycles.zarr"
    zarr.open_group(str(root), mode="w")
    zarr.create_array(str(root / "g" / "arr"), shape=(4,), chunks=(4,), dtype="u1", fill_value=0)
    zarr.create_array(str(root / "other"), shape=(4,), chunks=(4,), dtype="u1", fill_value=0)
    (root / "a").symlink_to(".")
    (root / "b").symlink_to(root)
    (root / "g" / "up").symlink_to("..")
    (root / "g" / "self").symlink_to(".")
    (root / "g" / "sibling").symlink_to("../other")
    view = make_view(MountConfig([str(root)], "/nonexistent", read_only=True))
    assert sorted(name for name, _ in view.list_dir(())) == ["g", "other", "zarr.json"]
    assert sorted(name for name, _ in view.list_dir(("g",))) == ["arr", "sibling", "zarr.json"]
    assert ("g", "sibling") in dict(view.arrays())
    # a walk of every key below a prefix (what listings through storage transformers
    # use) takes no loop either, and still follows the link to a sibling
    zarr.open_array(str(root / "g" / "arr"), mode="r+")[...] = 1
    (root / "g" / "arr" / "c" / "x").symlink_to(".")
    (root / "g" / "arr" / "c" / "y").symlink_to(".")
    keys = AtomicLocalStore(str(root), read_only=True)._walk_keys("g/")
    assert "g/arr/c/0" in keys and "g/sibling/zarr.json" in keys
    assert not [k for k in keys if "/x/" in k or "/y/" in k or "/up/" in k or "/self/" in k]
    # a chain of links without a loop (two to the next directory, level after level:
    # 2**n paths) is walked to a bound, not for ever
    chain = root / "chain"
    for level in range(40):
        (chain / f"d{level}").mkdir(parents=True)
        (chain / f"d{level}" / "k").write_bytes(b"x")
    for level in range(39):
        for name in ("x", "y"):
            (chain / f"d{level}" / name).symlink_to(f"../d{level + 1}")
    walked = AtomicLocalStore(str(root), read_only=True)._walk_keys("chain/d0/")
    assert "chain/d0/k" in walked and len(walked) <= 2 * local_store.LINKED_DIRS_WALKED_MAX + 2
    everything = AtomicLocalStore(str(root), read_only=True)._walk_keys("")
    assert {"zarr.json", "other/zarr.json", "g/arr/c/0", "g/sibling/zarr.json"} <= set(everything)
    assert not [k for k in everything if k.startswith(("a/", "b/"))]


def test_a_concat_description_s_sources_read_nothing_outside(tmp_path: Path) -> None:
    """[outside-1] the sources a concatenation description names are opened on the
    mount's own stores: a chunk of one that is a link to a file outside is refused, as
    in any store (zarr's own store, which read them before, followed it)."""
    from zfuse.ext.concat import save_concat

    private = _private(tmp_path)
    for name in ("a", "b"):
        z = zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=(4, 4), chunks=(4, 4), dtype="u1",
                              compressors=None, fill_value=0)
        z[...] = 1
    (tmp_path / "b.zarr" / "c" / "0" / "0").unlink()
    (tmp_path / "b.zarr" / "c" / "0" / "0").symlink_to(private / "secret")
    save_concat(tmp_path / "ab.json", [tmp_path / "a.zarr", tmp_path / "b.zarr"], 0)
    view = make_view(MountConfig([str(tmp_path / "ab.json")], "/nonexistent", read_only=True))
    array = dict(view.arrays())[()]
    assert bytes(array.pixel_bytes((0, 0))) == bytes([1]) * 16
    with pytest.raises(OutsideStoreError, match="resolves outside the store"):
        array.pixel_bytes((1, 0))


def test_a_suffix_that_leaves_the_store_is_refused() -> None:
    from zfuse.ext.suffix import SuffixChunkKeyEncoding

    for suffix in ("/../../private/secret", "/..", "/./x", "/", ".t\\x"):
        with pytest.raises(MetadataError, match="suffix"):
            SuffixChunkKeyEncoding(suffix=suffix)
    assert SuffixChunkKeyEncoding(suffix="/data.bin").encode_chunk_key((0, 1)) == "c/0/1/data.bin"


# -- a hostile store, in process and mounted -------------------------------------------------


def _hostile_store(tmp_path: Path) -> Path:
    """A group whose arrays lead out of the store in every way, beside their own data."""
    private = _private(tmp_path)
    root = tmp_path / "store.zarr"
    group = zarr.open_group(str(root), mode="w")
    values = np.arange(64, dtype="u1").reshape(8, 8)
    # raw chunks (served from their stored files): one a link out, one a link inside
    raw = group.create_array("raw", shape=(8, 8), chunks=(4, 4), dtype="u1", compressors=None, fill_value=0)
    raw[...] = values
    (root / "raw" / "c" / "0" / "1").unlink()
    (root / "raw" / "c" / "0" / "1").symlink_to(private / "secret")
    (root / "raw" / "c" / "1" / "1").unlink()
    (root / "raw" / "c" / "1" / "1").symlink_to("../0/0")
    # decoded chunks: a link to a valid zstd chunk of the secret
    zst = group.create_array("zstd", shape=(8, 8), chunks=(4, 4), dtype="u1", fill_value=0)
    zst[...] = values
    secret_array = zarr.create_array(str(private / "a.zarr"), shape=(4, 4), chunks=(4, 4), dtype="u1")
    secret_array[...] = np.frombuffer(SECRET, dtype="u1").reshape(4, 4)
    (root / "zstd" / "c" / "0" / "1").unlink()
    (root / "zstd" / "c" / "0" / "1").symlink_to(private / "a.zarr" / "c" / "0" / "0")
    # a chunk directory that is a link out
    linked = group.create_array("dirlink", shape=(8, 8), chunks=(4, 4), dtype="u1", compressors=None, fill_value=0)
    linked[...] = values
    shutil.rmtree(root / "dirlink" / "c" / "1")
    (root / "dirlink" / "c" / "1").symlink_to(private / "dir")
    # a shard that is a link out
    sharded = group.create_array("sharded", shape=(8, 8), shards=(4, 8), chunks=(4, 4), dtype="u1",
                                 compressors=None, fill_value=0)
    sharded[...] = values
    shard_secret = zarr.create_array(str(private / "s.zarr"), shape=(8, 8), shards=(4, 8), chunks=(4, 4),
                                     dtype="u1", compressors=None, fill_value=0)
    shard_secret[...] = np.frombuffer(SECRET * 4, dtype="u1").reshape(8, 8)
    (root / "sharded" / "c" / "1" / "0").unlink()
    (root / "sharded" / "c" / "1" / "0").symlink_to(private / "s.zarr" / "c" / "0" / "0")
    # a suffix whose keys would leave the store
    group.create_array("suffix", shape=(4, 4), chunks=(4, 4), dtype="u1", compressors=None, fill_value=0)
    meta = json.loads((root / "suffix" / "zarr.json").read_text())
    meta["chunk_key_encoding"] = {"name": "suffix", "configuration": {
        "suffix": "/../../../../private/secret", "base_encoding": {"name": "default"}}}
    (root / "suffix" / "zarr.json").write_text(json.dumps(meta))
    # a group member that is a link out of the store (to an array of the secret)
    (root / "linked").symlink_to(private / "a.zarr")
    # an OME multiscale whose dataset path leads up and out of its group
    ms = group.create_group("ms")
    ms.attrs["multiscales"] = [{"version": "0.4", "axes": [{"name": "y"}, {"name": "x"}],
                                "datasets": [{"path": "../../private/a.zarr"}]}]
    return root


def test_a_hostile_store_in_process(tmp_path: Path) -> None:
    """The view (no FUSE): the chunks that lead out fail with OutsideStoreError, all
    others read the store's values; no whole-image file holds a byte from outside."""
    root = _hostile_store(tmp_path)
    view = make_view(MountConfig([str(root)], "/nonexistent", read_only=True))
    arrays = dict(view.arrays())
    values = np.arange(64, dtype="u1").reshape(8, 8)
    raw = arrays[("raw",)]
    assert raw.open_stored((0, 1)) is None  # not served from the link
    with pytest.raises(OutsideStoreError, match="raw/c/0/1"):
        raw.pixel_bytes((0, 1))
    assert bytes(raw.pixel_bytes((0, 0))) == values[:4, :4].tobytes()
    assert bytes(raw.pixel_bytes((1, 1))) == values[:4, :4].tobytes()  # the link inside
    with pytest.raises(OutsideStoreError, match="zstd/c/0/1"):
        arrays[("zstd",)].pixel_bytes((0, 1))
    assert bytes(arrays[("zstd",)].pixel_bytes((1, 0))) == values[4:, :4].tobytes()
    dirlink = arrays[("dirlink",)]
    assert [name for name, _ in view.list_dir(("dirlink", "c", "1"))] == []
    with pytest.raises(OutsideStoreError):
        dirlink.pixel_bytes((1, 0))
    sharded = arrays[("sharded",)]
    assert bytes(sharded.pixel_bytes((0, 1))) == values[:4, 4:].tobytes()
    with pytest.raises(CorruptDataError, match="sharded/c/1/0.*outside the store"):
        sharded.pixel_bytes((1, 0))
    # the suffix array is not shown, with its reason; the dataset path is not followed
    assert ("suffix",) not in arrays
    assert ("linked",) not in arrays and "linked" not in [name for name, _ in view.list_dir(())]
    assert any(path == "suffix" and "suffix" in reason for path, reason in view.problems)
    assert view.whole_images(("ms",)) == {}
    for path in (("raw",), ("zstd",), ("dirlink",), ("sharded",)):
        image = view.whole_images(path)["image.ome.tif"]
        size = view.entry((*path, "image.ome.tif")).size  # type: ignore[union-attr]
        got = b""
        for offset in range(0, size, 1 << 16):
            try:
                got += image.read(offset, 1 << 16)
            except CorruptDataError:  # (OutsideStoreError is one: EIO on the mount)
                pass
        assert SECRET[:8] not in got, path


OTHER_USER = "zfuse-other"


@pytest.fixture(scope="module")
def other_user() -> str:
    """A second, unprivileged user (made with useradd when missing)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the daemon of this test runs as root, the reader as another user")
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                               OTHER_USER], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"cannot make a second user: {made.stderr.strip()}")
    return OTHER_USER


@pytest.fixture
def shared_mounts() -> Iterator[Mounts]:
    """Mounts under a directory every user may pass through (pytest's tmp_path is 0700)."""
    base = Path(tempfile.mkdtemp(prefix="zfuse-outside-"))
    base.chmod(0o755)
    try:
        with Mounts(base) as mounts:
            yield mounts
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _read_as(user: str, path: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["cat", str(path)], user=user, capture_output=True, timeout=60)


def test_another_user_never_reads_a_file_outside_the_store(
    tmp_path: Path, other_user: str, shared_mounts: Mounts
) -> None:
    """[outside-1] [outside-2] A root daemon, `-o ro,allow_other`, a hostile store: the
    other user reading through the mount gets EIO for each chunk that leads out of
    the store (a link to a root-only file, a linked directory, a linked shard), never
    the secret, and reads every chunk of the store's own; `image.ome.tif` has no
    byte of the secret; the `suffix` array whose keys would leave the store is a
    README; the dataset path with `..` gives no pyramid; a group member linked out
    of the store is not shown. The log names each key."""
    root = _hostile_store(tmp_path)
    m = shared_mounts.start(root, "-o", "ro,allow_other", name="mnt")
    mnt = m.path
    assert _read_as(other_user, tmp_path / "private" / "secret").returncode != 0  # it is root's
    # the link out: EIO for that file, nothing of the secret
    got = _read_as(other_user, mnt / "raw" / "c" / "0" / "1.tiff")
    assert got.returncode != 0 and b"Input/output error" in got.stderr and SECRET not in got.stdout
    got = _read_as(other_user, mnt / "zstd" / "c" / "0" / "1.tiff")
    assert got.returncode != 0 and SECRET not in got.stdout
    got = _read_as(other_user, mnt / "sharded" / "c" / "1" / "0.tiff")
    assert got.returncode != 0 and SECRET not in got.stdout
    assert os.listdir(mnt / "dirlink" / "c" / "1") == []
    got = _read_as(other_user, mnt / "dirlink" / "c" / "1" / "0.tiff")
    assert got.returncode != 0 and SECRET not in got.stdout
    # the store's own chunks read, as that user
    values = np.arange(64, dtype="u1").reshape(8, 8)
    for array in ("raw", "zstd", "dirlink", "sharded"):
        got = _read_as(other_user, mnt / array / "c" / "0" / "0.tiff")
        assert got.returncode == 0, (array, got.stderr)
        np.testing.assert_array_equal(tifffile.imread(_bytes_io(got.stdout)), values[:4, :4])
    got = _read_as(other_user, mnt / "raw" / "c" / "1" / "1.tiff")  # a link inside: followed
    np.testing.assert_array_equal(tifffile.imread(_bytes_io(got.stdout)), values[:4, :4])
    for array in ("raw", "zstd", "dirlink", "sharded"):
        got = _read_as(other_user, mnt / array / "image.ome.tif")
        assert SECRET[:8] not in got.stdout, array
    assert sorted(os.listdir(mnt / "suffix")) == ["README", "zarr.json"]
    assert "suffix" in (mnt / "suffix" / "README").read_text()
    assert "pyramid.ome.tif" not in os.listdir(mnt / "ms")
    assert "linked" not in os.listdir(mnt)
    log = m.log()
    assert "raw/c/0/1" in log and "outside the store" in log


def _bytes_io(data: bytes) -> object:
    import io

    return io.BytesIO(data)


# -- leftovers of an interrupted write ---------------------------------------------------------


def _leftover(directory: Path, name: str, age: float = 3600) -> Path:
    path = directory / f".{name}.ab_c1234.tmp"
    path.write_bytes(b"half a chunk")
    old = time.time() - age
    os.utime(path, (old, old))
    return path


def test_leftover_temporary_files_are_not_listed_and_old_ones_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    (root / "c" / "0").mkdir(parents=True)
    (root / "c" / "0" / "0").write_bytes(b"chunk")
    old = _leftover(root / "c" / "0", "0")
    young = _leftover(root / "c" / "0", "1", age=0)  # maybe another writer's, right now
    other = root / "c" / "0" / ".0.not-ours.tmp"  # not zfuse's name: left alone
    other.write_bytes(b"x")
    stats = Stats()
    local = AtomicLocalStore(str(root))
    store = MeteredStore(local, stats)
    names = [n for page in store.list_dir_local("c/0/", 100) for n in page]
    assert sorted(names) == [".0.not-ours.tmp", "0"]
    assert not old.exists() and young.exists() and other.exists()
    assert stats.snapshot().get("leftovers_removed") == 1
    # the async listings leave them out too
    _leftover(root / "c" / "0", "0")

    async def collect(it: object) -> list[str]:
        return sorted([k async for k in it])  # type: ignore[attr-defined]

    assert zarr.core.sync.sync(collect(store.list_dir("c/0/"))) == [".0.not-ours.tmp", "0"]
    _leftover(root / "c" / "0", "0")
    assert zarr.core.sync.sync(collect(store.list_prefix(""))) == ["c/0/.0.not-ours.tmp", "c/0/0"]
    # a read-only store lists them out but removes nothing
    kept = _leftover(root / "c" / "0", "0")
    ro = MeteredStore(AtomicLocalStore(str(root), read_only=True), Stats())
    assert sorted(n for page in ro.list_dir_local("c/0/", 100) for n in page) == [".0.not-ours.tmp", "0"]
    assert kept.exists()


def test_a_leftover_at_mount_is_not_a_chunk_and_is_removed(tmp_path: Path, mount) -> None:
    """[write-11] A `.0.XXXXXXXX.tmp` file a crashed daemon left in a chunk directory is
    not listed, not readable as a chunk, and is removed (logged, counted in
    `.zfuse/stats`) when the mount lists its directory."""
    root = tmp_path / "a.zarr"
    arr = zarr.create_array(str(root), shape=(4, 8), chunks=(4, 4), dtype="u1", compressors=None,
                            chunk_key_encoding={"name": "v2", "separator": "."})
    arr[...] = 7
    left = _leftover(root, "0.0")
    m = mount(root)
    assert sorted(os.listdir(m.path)) == ["0.0.tiff", "0.1.tiff", "image.ome.tif", "image.tif", "zarr.json"]
    assert not left.exists()
    assert not (m.path / f"{left.name}.tiff").exists()
    assert m.stats().get("leftovers_removed") == 1
    assert "removed a temporary file left by an interrupted write" in m.log()
    np.testing.assert_array_equal(tifffile.imread(m.path / "0.0.tiff"), np.full((4, 4), 7, "u1"))
