"""`zfuse.testing.FaultyStore`, the fault injector the fault tests mount: each kind of
fault, the counting that makes it deterministic, and the control file a daemon reads.
No FUSE: zarr-python reads through the wrapper in this process."""

from __future__ import annotations

import asyncio
import errno
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.abc.store import RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore, MemoryStore

from zfuse.testing import Fault, FaultyStore, read_fault_journal, wait_until, write_faults

PROTO = default_buffer_prototype()


def _filled() -> tuple[MemoryStore, np.ndarray]:
    store = MemoryStore()
    data = np.arange(64, dtype="uint16").reshape(8, 8)
    zarr.create_array(store, shape=(8, 8), chunks=(4, 4), dtype="uint16", compressors=None, fill_value=0)[:] = data
    return store, data


def _get(store: FaultyStore, key: str, byte_range: object = None) -> bytes | None:
    async def go() -> bytes | None:
        buf = await store.get(key, PROTO, byte_range)  # type: ignore[arg-type]
        return None if buf is None else buf.to_bytes()

    return asyncio.run(go())


def test_an_error_hits_the_matching_key_only() -> None:
    inner, data = _filled()
    store = FaultyStore(inner, [Fault("error", pattern="c/0/1", errno=errno.EACCES)])
    arr = zarr.open_array(store, mode="r")
    with pytest.raises(PermissionError):
        arr[0:4, 4:8]
    np.testing.assert_array_equal(arr[0:4, 0:4], data[0:4, 0:4])
    np.testing.assert_array_equal(arr[4:8, :], data[4:8, :])
    assert ("get", "c/0/1", "error") in store.injected
    store.set_faults([Fault("error", pattern="c/*", exception=RuntimeError("boom"))])
    with pytest.raises(RuntimeError, match="boom"):
        arr[0, 0]
    store.set_faults([])
    np.testing.assert_array_equal(arr[:], data)


def test_counting_after_every_times_is_deterministic() -> None:
    inner, _ = _filled()
    store = FaultyStore(inner, [Fault("error", pattern="c/1/1", after=2, every=2, times=2)])
    outcomes = []
    for _ in range(10):
        try:
            _get(store, "c/1/1")
            outcomes.append("ok")
        except OSError as e:
            assert e.errno == errno.EIO
            outcomes.append("EIO")
    # requests 1, 2 pass (after=2); then every 2nd of the rest is hit, twice (times=2)
    assert outcomes == ["ok", "ok", "EIO", "ok", "EIO", "ok", "ok", "ok", "ok", "ok"]
    assert [r for r in store.requests if r[0] == "get"] == [("get", "c/1/1")] * 10


def test_the_first_matching_rule_wins_and_every_rule_counts() -> None:
    inner, _ = _filled()
    store = FaultyStore(inner, [Fault("error", pattern="c/0/0", times=1, errno=errno.ENOENT),
                                Fault("error", pattern="c/*", after=1, times=1)])
    with pytest.raises(FileNotFoundError):
        _get(store, "c/0/0")  # rule 0; rule 1 counted it as its first (let through)
    with pytest.raises(OSError) as e:
        _get(store, "c/0/0")  # rule 0 used up; rule 1's second match: hit
    assert e.value.errno == errno.EIO
    assert _get(store, "c/0/0") is not None


def test_short_reads_whole_and_ranged() -> None:
    inner, _ = _filled()
    whole = _get(FaultyStore(inner), "c/0/0")
    assert whole is not None and len(whole) == 32
    store = FaultyStore(inner, [Fault("short", pattern="c/0/0")])
    assert _get(store, "c/0/0") == whole[:-1]
    assert _get(store, "c/0/0", RangeByteRequest(4, 12)) == whole[4:11]
    store.set_faults([Fault("short", pattern="c/0/0", keep=3)])
    assert _get(store, "c/0/0", SuffixByteRequest(10)) == whole[-10:-7]
    assert _get(store, "c/0/1") == _get(FaultyStore(inner), "c/0/1")
    assert _get(store, "c/9/9") is None  # nothing stored: nothing to shorten
    with pytest.raises(ValueError):  # zarr's bytes codec on a truncated raw chunk
        zarr.open_array(FaultyStore(inner, [Fault("short", pattern="c/0/0")]), mode="r")[0, 0]


def test_byte_range_kinds_select_requests() -> None:
    inner, _ = _filled()
    store = FaultyStore(inner, [Fault("error", pattern="c/0/0", byte_range="suffix")])
    assert _get(store, "c/0/0") is not None
    assert _get(store, "c/0/0", RangeByteRequest(0, 2)) is not None
    with pytest.raises(OSError):
        _get(store, "c/0/0", SuffixByteRequest(2))
    with pytest.raises(ValueError):
        Fault("error", byte_range="middle")
    with pytest.raises(ValueError):
        Fault("explode")
    with pytest.raises(ValueError):
        Fault("error", ops=("read",))


def test_writes_and_deletes_fail_before_reaching_the_store() -> None:
    inner, data = _filled()
    store = FaultyStore(inner, [Fault("error", pattern="c/0/0", ops=("set", "delete"), errno=errno.ENOSPC)])
    arr = zarr.open_array(store, mode="r+")
    before = _get(FaultyStore(inner), "c/0/0")
    with pytest.raises(OSError) as e:
        arr[0:4, 0:4] = 7
    assert e.value.errno == errno.ENOSPC
    assert _get(FaultyStore(inner), "c/0/0") == before
    with pytest.raises(OSError):
        asyncio.run(store.delete("c/0/0"))
    arr[4:8, 4:8] = 9  # other keys are written
    np.testing.assert_array_equal(zarr.open_array(inner, mode="r")[4:8, 4:8], 9)
    np.testing.assert_array_equal(zarr.open_array(inner, mode="r")[0:4, 0:4], data[0:4, 0:4])


def test_listings_fail_or_hang_on_their_prefix() -> None:
    inner, _ = _filled()
    store = FaultyStore(inner, [Fault("error", pattern="c/1/*", ops=("list",))])

    async def names(prefix: str) -> list[str]:
        return [k async for k in store.list_dir(prefix)]

    assert sorted(asyncio.run(names("c/0/"))) == ["0", "1"]
    with pytest.raises(OSError):
        asyncio.run(names("c/1/"))
    store.set_faults([Fault("hang", pattern="c/1/*", ops=("list",))])

    async def bounded() -> None:
        await asyncio.wait_for(names("c/1/"), 0.2)

    with pytest.raises(TimeoutError):  # a hang is cancellable, as a request in flight
        asyncio.run(bounded())


def test_delay_and_hang_until_released() -> None:
    inner, data = _filled()
    store = FaultyStore(inner, [Fault("delay", pattern="c/0/0", seconds=0.05)])
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[:], data)
    store.set_faults([Fault("hang", pattern="c/1/1")])
    arr = zarr.open_array(store, mode="r")
    got: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: got.append(arr[4:8, 4:8]))
    reader.start()
    wait_until(lambda: ("get", "c/1/1", "hang") in store.injected, what="the hang to begin")
    assert reader.is_alive() and not got
    store.release()
    reader.join(30)
    np.testing.assert_array_equal(got[0], data[4:8, 4:8])
    assert ("get", "c/1/1", "released") in store.injected
    # a hang with seconds ends by itself
    store.set_faults([Fault("hang", pattern="c/1/1", seconds=0.05)])
    np.testing.assert_array_equal(arr[4:8, 4:8], data[4:8, 4:8])


def test_control_file_and_journal(tmp_path: Path) -> None:
    """A daemon's FaultyStore takes its rules from a file, read again when it changes,
    and writes each fault it injects to a journal; a new file ends hangs."""
    root = tmp_path / "a.zarr"
    data = np.arange(64, dtype="uint16").reshape(8, 8)
    zarr.create_array(str(root), shape=(8, 8), chunks=(4, 4), dtype="uint16", fill_value=0)[:] = data
    control, journal = tmp_path / "faults.json", tmp_path / "journal"
    store = FaultyStore(LocalStore(str(root), read_only=True), control=control, journal=journal)
    arr = zarr.open_array(store, mode="r")
    np.testing.assert_array_equal(arr[:], data)  # no control file yet: no faults
    write_faults(control, [Fault("error", pattern="c/0/*", errno=errno.EACCES, times=1),
                           Fault("error", pattern="c/1/0", exception=TimeoutError("slow"))])
    with pytest.raises(PermissionError):
        arr[0:4, 0:4]
    np.testing.assert_array_equal(arr[0:4, 0:4], data[0:4, 0:4])  # times=1
    with pytest.raises(TimeoutError, match="slow"):
        arr[4:8, 0:4]
    assert [(e["op"], e["key"], e["kind"], e["rule"]) for e in read_fault_journal(journal)] == [
        ("get", "c/0/0", "error", 0), ("get", "c/1/0", "error", 1)]
    write_faults(control, [Fault("hang", pattern="c/1/1")])
    got: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: got.append(arr[4:8, 4:8]))
    reader.start()
    wait_until(lambda: read_fault_journal(journal)[-1]["kind"] == "hang", what="the hang to begin")
    write_faults(control, [])
    reader.join(30)
    np.testing.assert_array_equal(got[0], data[4:8, 4:8])
    assert read_fault_journal(journal)[-1]["kind"] == "released"
    # copies zarr makes (with_read_only) share the rules and the record
    copy = store.with_read_only(True)
    assert isinstance(copy, FaultyStore) and copy.injected is store.injected


def test_rules_round_trip_through_json() -> None:
    rules = [Fault("error", pattern="a/*", ops=("get", "set"), errno=errno.ENOSPC, after=1, every=2, times=3),
             Fault("error", exception=ConnectionResetError("reset")),
             Fault("short", keep=5, byte_range="range"), Fault("hang", seconds=2.5), Fault("delay", seconds=0.1)]
    back = [Fault.from_json(r.to_json()) for r in rules]
    for a, b in zip(rules, back, strict=True):
        assert a.to_json() == b.to_json()
    assert back[0].errno == errno.ENOSPC and back[0].ops == ("get", "set")
    assert isinstance(back[1].exception, ConnectionResetError)
    assert Fault.from_json(Fault("error", exception=PermissionError(errno.EACCES, "no")).to_json()).make_error(
        "get", "k").errno == errno.EACCES
    with pytest.raises(ValueError):
        Fault.from_json({"kind": "error", "exception": ["os.system", "x"]})
