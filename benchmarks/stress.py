"""Atomic-save and cp replacements against concurrent readers on one mount (issue 16).

Two roles, each its own process (the writing process sees its own bytes by
design, so readers must be another process):

    python -m benchmarks.stress writers MOUNT SECONDS CHUNK [CHUNK ...]
    python -m benchmarks.stress readers MOUNT SECONDS THREADS CHUNK [CHUNK ...]

A writer thread per chunk alternates the atomic-save pattern (write
`.<name>.tmp` in the same directory, rename onto the chunk) and `cp` onto the
chunk, each time a uniform chunk of value owner*1_000_000 + n (uint32). Reader
threads stat, open and read random chunks, and list their directories; each
read must be a uniform chunk of the initial value or one of its writer's
values. Each role prints one JSON line of counts. `run()` drives both for a
mounted store and returns the combined figures.
"""

from __future__ import annotations

import errno
import io
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

INITIAL = 999  # every chunk starts uniform at INITIAL + its index
STEP = 1_000_000


def chunk_value_ok(value: int, index: int) -> bool:
    return value == INITIAL + index or value // STEP == index + 1


def _tiff(shape: tuple[int, ...], value: int) -> bytes:
    import tifffile

    out = io.BytesIO()
    tifffile.imwrite(out, np.full(shape, value, "uint32"))
    return out.getvalue()


def writers(mount: Path, seconds: float, chunks: list[str], shape: tuple[int, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    result: dict[str, Any] = {"ops": 0, "errors": [], "last": {}}
    lock = threading.Lock()

    def work(index: int, rel: str) -> None:
        target = mount / rel
        scratch = target.parent / f".{target.name}.tmp"
        n = 0
        while time.monotonic() < deadline:
            n += 1
            value = (index + 1) * STEP + n
            data = _tiff(shape, value)
            try:
                if n % 2:
                    scratch.write_bytes(data)
                    os.rename(scratch, target)  # atomic save
                else:
                    with open(target, "wb") as f:  # cp onto the chunk: O_TRUNC, write, close
                        f.write(data)
            except OSError as e:
                with lock:
                    result["errors"].append(f"{rel}: {e}")
                continue
            with lock:
                result["ops"] += 1
                result["last"][rel] = value

    threads = [threading.Thread(target=work, args=(i, c)) for i, c in enumerate(chunks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return result


def readers(mount: Path, seconds: float, threads_n: int, chunks: list[str]) -> dict[str, Any]:
    import tifffile

    deadline = time.monotonic() + seconds
    counts = {"reads": 0, "stats": 0, "listings": 0, "enoent": 0, "torn": 0, "bad_value": 0,
              "missing_in_listing": 0, "other_errors": 0}
    examples: list[str] = []
    lock = threading.Lock()

    def bump(key: str, example: str | None = None) -> None:
        with lock:
            counts[key] += 1
            if example and len(examples) < 10:
                examples.append(example)

    def work(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            index = rng.randrange(len(chunks))
            rel = chunks[index]
            path = mount / rel
            op = rng.random()
            try:
                if op < 0.2:
                    os.stat(path)
                    bump("stats")
                elif op < 0.3:
                    names = set(os.listdir(path.parent))
                    bump("listings")
                    siblings = [c for c in chunks if (mount / c).parent == path.parent]
                    for c in siblings:
                        if Path(c).name not in names:
                            bump("missing_in_listing", f"{c} missing from a listing")
                else:
                    with open(path, "rb") as f:
                        data = f.read()
                    values = tifffile.imread(io.BytesIO(data))
                    first = int(values.flat[0])
                    if not (values == first).all():
                        bump("torn", f"{rel}: not uniform")
                    elif not chunk_value_ok(first, index):
                        bump("bad_value", f"{rel}: value {first}")
                    else:
                        bump("reads")
            except FileNotFoundError as e:
                bump("enoent", f"{rel}: {e}")
            except OSError as e:
                bump("enoent" if e.errno == errno.ENOENT else "other_errors", f"{rel}: {e!r}")
            except Exception as e:  # unparsable bytes: a torn file
                bump("torn", f"{rel}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {**counts, "examples": examples}


def run(mount: Path, chunks: list[str], shape: tuple[int, ...], seconds: float = 4.0,
        reader_threads: int = 8) -> dict[str, Any]:
    """Writers and readers at once, each in its own process; their combined counts."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    common = [sys.executable, "-m", "benchmarks.stress"]
    shape_arg = "x".join(str(n) for n in shape)
    w = subprocess.Popen([*common, "writers", str(mount), str(seconds), shape_arg, *chunks],
                         stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    r = subprocess.Popen([*common, "readers", str(mount), str(seconds), str(reader_threads), *chunks],
                         stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    w_out, _ = w.communicate(timeout=seconds + 120)
    r_out, _ = r.communicate(timeout=seconds + 120)
    if w.returncode or r.returncode:
        raise RuntimeError(f"stress processes failed: writers {w.returncode}, readers {r.returncode}")
    wr, rd = json.loads(w_out.strip().splitlines()[-1]), json.loads(r_out.strip().splitlines()[-1])
    reader_ops = rd["reads"] + rd["stats"] + rd["listings"]
    return {"writers": wr, "readers": rd, "seconds": seconds,
            "write_ops_per_s": wr["ops"] / seconds, "read_ops_per_s": reader_ops / seconds}


def main(argv: list[str]) -> int:
    role, mount, seconds = argv[0], Path(argv[1]), float(argv[2])
    if role == "writers":
        shape = tuple(int(n) for n in argv[3].split("x"))
        out = writers(mount, seconds, argv[4:], shape)
    else:
        out = readers(mount, seconds, int(argv[3]), argv[4:])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
