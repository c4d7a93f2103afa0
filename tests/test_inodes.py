"""The inode table with plain calls: a directory's entries numbered as one run, made
Inodes only when asked for as one, and the kernel's references counted either way."""

from __future__ import annotations

import threading

from zfuse.inodes import Inode, InodeTable

ROOT = 1
DIR = ("c", "0")
NAMES = [f"{j}.tiff" for j in range(10)]  # sorted as a listing is: 0, 1, ..., 9


def table() -> InodeTable:
    return InodeTable(Inode(ROOT, (), lookups=1))


def listed(t: InodeTable, start: int = 0, end: int = len(NAMES)) -> int:
    first = t.run_first(DIR, NAMES)
    assert first is not None
    t.add_run(DIR, NAMES, first, start, end)
    return first


def test_a_run_numbers_its_entries_in_order_without_making_inodes() -> None:
    t = table()
    t.new(DIR)
    first = listed(t)
    assert [t.ino_of((*DIR, n)) for n in NAMES] == list(range(first, first + 10))
    assert len(t) == 2 + 10  # the root, c/0 and the ten entries
    assert t.path_of(first + 3) == (*DIR, "3.tiff")
    assert t._inodes.keys() == {ROOT, t.ino_of(DIR)}  # none of the entries is an object yet
    # numbers are never handed out twice
    assert t.new(("c", "1")).ino >= first + 10


def test_an_entry_asked_for_becomes_an_inode_with_its_references() -> None:
    t = table()
    first = listed(t)
    t.remember(first + 2)  # a lookup reply: one more reference, still no object
    inode = t[first + 2]
    assert inode.path == (*DIR, "2.tiff") and inode.lookups == 2
    assert t.get(first + 2) is inode and t.new((*DIR, "2.tiff")) is inode
    assert t.ino_of((*DIR, "2.tiff")) == first + 2


def test_forgetting_frees_run_entries_and_then_the_run() -> None:
    t = table()
    first = listed(t)
    assert t.forget(first, 1) == (*DIR, "0.tiff")  # its last reference: gone
    assert first not in t and t.ino_of((*DIR, "0.tiff")) is None
    t.remember(first + 1)
    assert t.forget(first + 1, 1) is None  # one reference left
    for i in range(1, 10):
        t.forget(first + i, 2 if i == 1 else 1)
    assert t._runs == {} and t._run_firsts == [] and len(t) == 1
    # listed again: new numbers
    again = listed(t)
    assert again >= first + 10


def test_a_listing_again_counts_one_more_reference_per_entry() -> None:
    t = table()
    first = listed(t)
    assert t.run_first(DIR, NAMES) == first  # the same names: the same numbers
    listed(t)
    assert t[first + 5].lookups == 2


def test_a_buffer_full_run_goes_on_where_it_stopped() -> None:
    t = table()
    first = listed(t, 0, 4)
    assert t.ino_of((*DIR, "4.tiff")) is None  # not offered yet: unknown
    assert listed(t, 4, 10) == first
    assert all(t.ino_of((*DIR, n)) == first + i for i, n in enumerate(NAMES))
    listed(t, 3, 3)  # nothing taken: nothing changes
    assert t[first + 3].lookups == 1


def test_runs_step_aside_for_entries_known_on_their_own() -> None:
    t = table()
    t.new((*DIR, "7.tiff"))
    assert t.run_first(DIR, NAMES) is None  # a child has an inode: entry by entry
    t2 = table()
    listed(t2)
    assert t2.run_first(DIR, NAMES[:5]) is None  # the directory changed
    first = t2.ino_of((*DIR, "0.tiff"))
    assert first is not None
    t2[first + 1]  # made an Inode: the run no longer stands for every entry
    assert t2.run_first(DIR, NAMES) is None


def test_a_detached_entry_keeps_its_number_and_its_name_gets_a_new_one() -> None:
    t = table()
    first = listed(t)
    taken = t.take_path((*DIR, "4.tiff"))  # replaced or unlinked
    assert taken is not None and taken.ino == first + 4 and taken.path == (*DIR, "4.tiff")
    assert t[first + 4] is taken  # valid by number
    fresh = t.new((*DIR, "4.tiff"))
    assert fresh.ino != first + 4 and t.ino_of((*DIR, "4.tiff")) == fresh.ino
    assert t.run_first(DIR, NAMES) is None  # never offer the detached number again


def test_a_renamed_entry_follows_its_new_name() -> None:
    t = table()
    first = listed(t)
    inode = t.take_path((*DIR, "1.tiff"))
    assert inode is not None
    t.set_path(inode, ("c", "9", "9.tiff"))
    assert t.ino_of(("c", "9", "9.tiff")) == first + 1 and t.ino_of((*DIR, "1.tiff")) is None
    assert t.forget(first + 1, 1) == ("c", "9", "9.tiff")
    assert t.ino_of(("c", "9", "9.tiff")) is None


def test_inos_lists_run_entries_with_references() -> None:
    t = table()
    first = listed(t, 0, 3)
    assert sorted(t.inos()) == [ROOT, first, first + 1, first + 2]


def test_numbers_reserved_from_threads_never_overlap() -> None:
    t = table()
    got: list[range] = []

    def take() -> None:
        for _ in range(200):
            first = t.reserve(7)
            got.append(range(first, first + 7))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    numbers = [n for r in got for n in r]
    assert len(numbers) == len(set(numbers)) == 4 * 200 * 7 and ROOT not in numbers
