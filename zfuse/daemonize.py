"""Running the daemon: in the foreground (what systemd and `-f` run), or forked into
the background with a pipe that says "ready" once the mount is live (what `zfuse
mount` returns on), its standard streams let go of and its log set up.

The CLI (`zfuse.cli`) parses arguments and calls these; `zfuse.daemon` serves the
mount. Nothing here knows FUSE beyond calling `daemon.serve`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from zfuse.daemon import MountConfig
from zfuse.errors import ZfuseError, printable, source_label

__all__ = ["configure_logging", "describe_open_error", "run_foreground", "spawn_daemon"]


# `extra=` of a log line the terminal was already told in words of its own (a refused
# mount): it goes to the log file only, never twice on the terminal
FILE_ONLY = {"zfuse_file_only": True}


class _Printable(logging.Formatter):
    """Lines as UTF-8 can hold them: a file name that is not UTF-8 (surrogates, as the
    kernel's names are decoded) is escaped (the handler's strict encoding had dropped
    the whole line, and with it a refusal's reason); a message is one line, its control
    characters escaped (a newline in a file name forged log lines). Tracebacks stay as
    they are."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = printable(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).encode("utf-8", "backslashreplace").decode("utf-8")


def _not_file_only(record: logging.LogRecord) -> bool:
    return not getattr(record, "zfuse_file_only", False)


def configure_logging(verbose: int, log_file: str | None = None, background: bool = False) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(level=level, stream=sys.stderr, format="zfuse[%(process)d] %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_file_only)
        handler.setFormatter(_Printable("zfuse[%(process)d] %(levelname)s %(name)s: %(message)s"))
    if background:
        # until it detaches, a background daemon's stderr is the caller's terminal:
        # only warnings there (a successful `zfuse mount` prints nothing)
        for handler in logging.getLogger().handlers:
            handler.setLevel(logging.WARNING)
    if log_file is not None:
        handler = logging.FileHandler(log_file, encoding="utf-8", errors="backslashreplace")
        handler.setFormatter(_Printable(
            "%(asctime)s zfuse[%(process)d] %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
    if not verbose:
        for noisy in ("botocore", "s3fs", "aiobotocore", "fsspec", "urllib3"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def describe_open_error(sources: list[str], exc: BaseException,
                        storage_options: dict[str, Any] | None = None) -> str:
    """One line naming the source and the cause, never an internal store wrapper.
    (`storage_options`: the mount's, to ask whether an S3 source's bucket exists.)"""
    from zfuse.view.codec_packages import import_failure

    shown = " ".join(source_label(s) for s in sources)  # (no credentials a URL holds: it is logged too)
    # before importing zarr: a broken codec package makes that fail too
    broken = import_failure(exc)
    if broken is not None:
        return f"cannot open {shown}: {broken}"
    from zarr.errors import NodeNotFoundError

    if isinstance(exc, NodeNotFoundError):
        missing = _missing_bucket(sources, storage_options)
        if missing is not None:
            return f"cannot open {shown}: there is no bucket {missing!r} at that endpoint"
        return f"no Zarr metadata (zarr.json, .zarray or .zgroup) found at {shown}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot open {shown}: {exc.strerror}"
    from zfuse.remote_objects import ConditionsIgnoredError

    if isinstance(exc, (ZfuseError, ConditionsIgnoredError)) and str(exc):
        # zfuse's own words (its class name says nothing more), which may name the source too
        return f"cannot open {shown}: {str(exc).removeprefix(shown + ': ')}"
    return f"cannot open {shown}: {type(exc).__name__}: {exc}"


def _missing_bucket(sources: list[str], storage_options: dict[str, Any] | None) -> str | None:
    """The bucket of an S3 source that does not exist (zarr reads a missing bucket's keys
    as missing keys: "no Zarr metadata" hid the misspelt bucket), asked once; None if it
    exists, the source is no S3 one, or the store cannot tell."""
    if len(sources) != 1 or not sources[0].startswith(("s3://", "s3a://")):
        return None
    from zfuse.store import (
        CACHE_LIMIT_OPTION,
        CACHE_OPTION,
        LAST_WRITER_WINS_OPTION,
        fsspec_options,
    )

    bucket = sources[0].split("://", 1)[1].split("/", 1)[0]
    options = {k: v for k, v in (storage_options or {}).items()
               if k not in (CACHE_OPTION, CACHE_LIMIT_OPTION, LAST_WRITER_WINS_OPTION)}
    try:
        import fsspec
        from botocore.exceptions import ClientError

        fs = fsspec.filesystem("s3", skip_instance_cache=True, **fsspec_options("s3", options))
        try:
            fs.call_s3("head_bucket", Bucket=bucket)
        except FileNotFoundError:
            return bucket  # (s3fs's translation of NoSuchBucket / 404)
        except ClientError as e:
            return bucket if str(e.response.get("Error", {}).get("Code")) in ("404", "NoSuchBucket") else None
        return None
    except Exception:  # noqa: BLE001 - only a better message was at stake (a 403: it may well exist)
        return None


def run_foreground(config: MountConfig, shown_sources: list[str], ready_fd: int | None,
                    verbose: int) -> int:
    from zfuse.daemon import (
        check_mountpoint,
        check_not_nested,
        check_sources,
        level_hint,
        mounted_elsewhere,
        read_ahead_hint,
        serve,
        unwritable_hint,
    )
    from zfuse.open_view import local_source_identities, make_view, reload_view
    from zfuse.stats import Stats

    log = logging.getLogger("zfuse.daemon")

    def report(message: str) -> None:
        if ready_fd is not None:
            os.write(ready_fd, message.encode())
            os.close(ready_fd)
            if message == "ready":
                _detach_stdio(config)

    def fail(message: str) -> int:
        # in the background the parent prints it; in the foreground we do
        if ready_fd is not None:
            report("error: " + message)
        else:
            print("zfuse: " + message, file=sys.stderr)
        if config.log_file is not None:
            log.error("%s", message, extra=FILE_ONLY)
        return 1

    if config.log_file is not None:
        from zfuse.daemon import check_not_nested

        try:  # (before the file is made: a refused one inside the mountpoint had been left there)
            check_not_nested(config.mountpoint, [], {"the log file": config.log_file})
        except SystemExit as e:
            config.log_file = None
            return fail(str(e.code).removeprefix("zfuse: "))
        try:
            open(config.log_file, "a").close()
        except OSError as e:
            config.log_file = None
            return fail(f"cannot write the log file {e.filename}: {e.strerror}")
        config.log_destination = config.log_file
    elif os.environ.get("JOURNAL_STREAM"):
        config.log_destination = "journal (stderr)"
    configure_logging(verbose, config.log_file, background=ready_fd is not None)
    try:
        warning = check_mountpoint(config.mountpoint)
        check_sources(shown_sources)  # as the user spelled them, from the user's directory
        from zfuse.store import CACHE_OPTION

        check_not_nested(config.mountpoint, shown_sources, {"-o cache=": (config.storage_options or {}).get(CACHE_OPTION)})
        # let go of the caller's directory (it could not be unmounted or removed
        # while the daemon runs); every path in `config` is absolute by now
        os.chdir("/")
        for message in (warning, mounted_elsewhere(config.sources), level_hint(config.sources),
                        unwritable_hint(config), read_ahead_hint(config)):
            if message:
                log.warning("%s", message)
        stats = Stats()
        identities = local_source_identities(config)  # (as found before the mount opens them)
        view = make_view(config, stats)
    except SystemExit as e:
        return fail(str(e.code).removeprefix("zfuse: "))
    except Exception as e:
        return fail(describe_open_error(shown_sources, e, config.storage_options))
    if verbose:
        config.log_operations = True
    try:
        serve(config, view, stats, on_ready=lambda: report("ready"),
              reload=lambda: reload_view(config, stats, identities))
    except Exception as e:
        return fail(f"mount failed: {e}")
    return 0


def _detach_stdio(config: MountConfig) -> None:
    """A backgrounded daemon lets go of its caller's stdout/stderr, as libfuse's
    fuse_daemonize does: `mount -t fuse.zfuse` run with pipes (`$(mount ...)`,
    subprocess) would otherwise wait for EOF until the filesystem is unmounted."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)  # stderr is /dev/null now
    if config.log_file is not None:
        return
    # no log file: the system log when there is one
    if os.path.exists("/dev/log"):
        from logging.handlers import SysLogHandler

        handler = SysLogHandler(address="/dev/log")
        handler.setFormatter(_Printable("zfuse[%(process)d]: %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        config.log_destination = "system log (/dev/log)"
    else:
        config.log_destination = "none (no --log-file, no system log)"


def spawn_daemon(config: MountConfig, shown_sources: list[str], verbose: int) -> int:
    """Run the daemon in the background; return once the mount is live or failed.

    The daemon is a fork of this process, not a new interpreter: it keeps what
    is imported already instead of starting Python and importing zfuse again
    (about a third of the time `zfuse mount` takes)."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the daemon
        code = 1
        try:
            os.close(read_fd)
            os.setsid()  # its own session: the caller's terminal and signals are not its own
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.close(devnull)
            code = run_foreground(config, shown_sources, write_fd, verbose)
        finally:
            logging.shutdown()
            os._exit(code)  # never back into the caller's code
    os.close(write_fd)
    chunks = []
    while True:
        data = os.read(read_fd, 4096)
        if not data:
            break
        chunks.append(data)
    os.close(read_fd)
    message = b"".join(chunks).decode(errors="replace")
    if message == "ready":
        if config.log_file is None and not os.path.exists("/dev/log"):
            print("zfuse: note: no --log-file and no system log here: the daemon's messages "
                  "(such as why a write was refused) are not kept; see zfuse mount -h",
                  file=sys.stderr)
        return 0
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if message.startswith("error: "):
        print("zfuse: " + message[len("error: "):], file=sys.stderr)
    else:
        print(f"zfuse: the daemon exited ({code}) before the mount was ready", file=sys.stderr)
    return 1
