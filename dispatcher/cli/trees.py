"""Client verbs that copy directory trees: ``upload`` into a session's workspace, ``download`` out
of it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from dispatcher.cli.output import EXIT_OK, EXIT_USAGE, json_line
from dispatcher.client import DispatcherClient
from dispatcher.trees import LocalTreeError

ClientFactory = Callable[[argparse.Namespace], DispatcherClient]


def add_verbs(verbs: Any, client_opts: argparse.ArgumentParser, client: ClientFactory) -> None:
    """Add ``upload`` and ``download`` to the CLI's sub-parsers."""
    upload = verbs.add_parser(
        "upload", parents=[client_opts], help="copy a local directory tree into a session's workspace"
    )
    upload.add_argument("session_id", metavar="SESSION")
    upload.add_argument("local_dir", metavar="LOCAL_DIR", help="its contents are copied (not the directory)")
    upload.add_argument(
        "dest", metavar="DEST", nargs="?", default=".", help="workspace directory (default: .)"
    )
    upload.set_defaults(func=lambda args: _upload(args, client))
    download = verbs.add_parser(
        "download", parents=[client_opts], help="copy a workspace file or directory to a local directory"
    )
    download.add_argument("session_id", metavar="SESSION")
    download.add_argument("path", metavar="PATH", help="workspace file or directory (a directory's contents)")
    download.add_argument("local_dir", metavar="LOCAL_DIR", help="made if missing")
    download.set_defaults(func=lambda args: _download(args, client))


def _upload(args: argparse.Namespace, client: ClientFactory) -> int:
    try:
        with client(args) as c:
            done = c.upload(args.session_id, args.local_dir, args.dest)
    except LocalTreeError as exc:
        print(f"dispatcher: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        json_line({"files": done.files, "directories": done.directories, "bytes": done.bytes})
    else:
        print(
            f"uploaded {done.files} files, {done.directories} directories, {done.bytes} bytes into {args.dest}"
        )
    return EXIT_OK


def _download(args: argparse.Namespace, client: ClientFactory) -> int:
    with client(args) as c:
        done = c.download(args.session_id, args.path, args.local_dir)
    for skipped in done.skipped:
        print(f"dispatcher: skipped {skipped}", file=sys.stderr)
    if args.json:
        json_line(
            {
                "files": done.files,
                "directories": done.directories,
                "bytes": done.bytes,
                "skipped": done.skipped,
            }
        )
    else:
        print(
            f"downloaded {done.files} files, {done.directories} directories, {done.bytes} bytes into {args.local_dir}"
        )
    return EXIT_OK
