"""The program ``glob`` and ``grep`` run in the sandbox: one walk of the workspace, bounded.

Sent as the source of ``python3 -I -`` (stdin), its request as JSON in ``DISPATCHER_SEARCH``, so no
input of the model's ever reaches a shell; it writes one JSON object to stdout. Stdlib only and
Python 3.9, like the agent: every sandbox image has a ``python3`` (the agent needs one).

Two engines, one semantics. With ``rg`` on the image's PATH (the default image from its next build),
ripgrep lists the files (``--files``) or searches them (``--json``), which honours every ignore rule;
without it, a walk here honours ``.gitignore`` files (the common cases: ``*``, ``?``, ``[...]``,
``**``, ``!`` negation, a trailing ``/`` for directories, anchoring by a ``/``) and searches with
Python's ``re``. Both skip ``.git``, include hidden files, never follow a symlink (a link to a file
or a directory is not searched, as ``grep -r`` does), skip binary files, and stop at the result
bound and at the time bound, saying so.

One file on purpose, past the size our modules keep: it travels as one source, and every search
starts it afresh. Split into modules bundled with a small loader, the same program started 1.3 ms
later per call (p50 of ``grep`` 19.98 to 21.32 ms here) for no change in what it does.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time

TYPE_CHECKING = False  # typing is not imported at run time: every call starts this program afresh
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    Line = Any
    """One line of grep's answer: ``[path, number, is_match, text]``, or ``None`` between two
    groups that are not adjacent (grep's ``--``); the server formats them (``path:line:text``)."""

MAX_FILE_BYTES = 16 * 1024 * 1024
"""Larger files are not searched (counted as skipped): a search reads each file whole."""
SNIFF = 8192
"""Bytes looked at for a NUL to call a file binary (skipped, as ``rg`` does)."""
MAX_ANSWER_CHARS = 64_000
"""Characters of grep's lines gathered at most (the server shows 40,000): context lines around many
long matches stop here, so the answer stays small whatever ``max_results`` allows."""


class RgFailed(Exception):
    """ripgrep ended in error having given nothing (an option it lacks, a regex it cannot read, a
    broken binary): the request is served again by the walk here, which reports its own errors."""


class SearchError(Exception):
    """A request this program cannot serve; ``code`` says why (``bad_regex``, ``bad_glob``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- globs: what gitignore lines and glob patterns mean -------------------------------------------


def glob_regex(pattern: str, *, braces: bool) -> str:
    """The regex (unanchored text) of a glob over ``/``-separated paths.

    ``**`` as a whole component spans any number of directories (none included), ``*`` and ``?``
    stay within one, ``[...]`` is a class (``[!...]`` negated), ``{a,b}`` alternatives with
    ``braces``; everything else is literal.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    depth = 0
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                at_start = i == 0 or pattern[i - 1] == "/"
                end = i + 2
                if at_start and end < n and pattern[end] == "/":
                    out.append("(?:[^/]*/)*")  # "**/": zero or more directories
                    i = end + 1
                    continue
                if at_start and end == n:
                    out.append(".*")  # "/**" at the end: everything below
                    i = end
                    continue
                out.append("[^/]*")  # "a**b": as "*"
                i = end
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            close = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^") else i + 1)
            if close < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : close]
                negate = body[:1] in ("!", "^")
                body = body[1:] if negate else body
                body = body.replace("\\", "\\\\")
                out.append("[" + ("^/" if negate else "") + body + "]")
                i = close
        elif c == "{" and braces:
            out.append("(?:")
            depth += 1
        elif c == "," and braces and depth:
            out.append("|")
        elif c == "}" and braces and depth:
            out.append(")")
            depth -= 1
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    if depth:
        raise SearchError("bad_glob", f"unbalanced '{{' in the glob {pattern!r}")
    return "".join(out)


def compile_glob(pattern: str) -> re.Pattern[str]:
    """A glob pattern of the tools (``**/*.py``, ``src/*.{ts,tsx}``) as a full-match regex."""
    try:
        return re.compile(glob_regex(pattern, braces=True), re.DOTALL)
    except re.error as exc:
        raise SearchError("bad_glob", f"invalid glob {pattern!r}: {exc}") from None


class IgnoreRule:
    """One line of a ``.gitignore``."""

    __slots__ = ("dir_only", "negate", "regex")

    def __init__(self, regex: re.Pattern[str], negate: bool, dir_only: bool) -> None:
        self.regex = regex
        self.negate = negate
        self.dir_only = dir_only


def parse_gitignore(text: str) -> list[IgnoreRule]:
    """The rules of a ``.gitignore`` file, in order (a later match overrides an earlier one)."""
    rules: list[IgnoreRule] = []
    for raw in text.splitlines():
        line = raw.rstrip(" \t\r") if not raw.rstrip("\r").endswith("\\ ") else raw.rstrip("\r")
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate or line.startswith("\\"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        body = glob_regex(line, braces=False)
        regex = body if anchored else "(?:[^/]*/)*" + body
        try:
            rules.append(IgnoreRule(re.compile(regex, re.DOTALL), negate, dir_only))
        except re.error:
            continue  # git ignores a line it cannot read; so do we
    return rules


Ignores = list[tuple[str, list[IgnoreRule]]]
"""The ``.gitignore`` rules in force in a directory: (the directory the file is in, its rules),
outermost first."""


def ignored(ignores: Ignores, rel: str, is_dir: bool) -> bool:
    """Whether the workspace path ``rel`` is ignored: the last rule that matches it decides."""
    verdict = False
    for base, rules in ignores:
        sub = rel[len(base) + 1 :] if base else rel
        for rule in rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.fullmatch(sub):
                verdict = not rule.negate
    return verdict


def _read_ignore(directory: str, rel: str, ignores: Ignores) -> Ignores:
    try:
        with open(os.path.join(directory, ".gitignore"), encoding="utf-8", errors="replace") as f:
            text = f.read(1024 * 1024)
    except OSError:
        return ignores
    rules = parse_gitignore(text)
    return [*ignores, (rel, rules)] if rules else ignores


# -- walking --------------------------------------------------------------------------------------


class Budget:
    """The time bound: past the deadline the walk stops and the answer says it is partial."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.expired = False

    def over(self) -> bool:
        if not self.expired and time.monotonic() > self.deadline:
            self.expired = True
        return self.expired


def walk(root: str, start: str, budget: Budget) -> Iterator[str]:
    """Workspace-relative paths of the files under ``start``, directory by directory, names sorted.

    Symlinks are never followed (nor listed), ``.git`` is skipped, ``.gitignore`` files from the
    workspace root down are honoured.
    """
    ignores: Ignores = []
    parts = [] if start in ("", ".") else start.split("/")
    for depth in range(len(parts)):  # the rules of the directories above the start apply too
        rel = "/".join(parts[:depth])
        ignores = _read_ignore(os.path.join(root, rel), rel, ignores)
    yield from _walk_dir(root, "" if start == "." else start, ignores, budget)


def _walk_dir(root: str, start: str, ignores: Ignores, budget: Budget) -> Iterator[str]:
    # A stack, not recursion: a tree deeper than Python's recursion limit is still walked.
    stack: list[tuple[str, Ignores, Iterator[os.DirEntry[str]]]] = []
    _enter(root, start, ignores, stack)
    while stack:
        rel, ignores, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        if budget.over():
            return
        path = f"{rel}/{entry.name}" if rel else entry.name
        try:
            if entry.is_symlink():
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            if not is_dir and not entry.is_file(follow_symlinks=False):
                continue  # fifos, sockets, devices: never opened
        except OSError:
            continue
        if is_dir and entry.name == ".git":
            continue
        if ignores and ignored(ignores, path, is_dir):
            continue
        if is_dir:
            _enter(root, path, ignores, stack)
        else:
            yield path


def _enter(
    root: str, rel: str, ignores: Ignores, stack: list[tuple[str, Ignores, Iterator[os.DirEntry[str]]]]
) -> None:
    """Push directory ``rel``: its entries sorted by name, its ``.gitignore`` added to the rules."""
    directory = os.path.join(root, rel) if rel else root
    try:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    stack.append((rel, _read_ignore(directory, rel, ignores), iter(entries)))


def rg_files(root: str, start: str, budget: Budget) -> Iterator[str]:
    """``walk`` by ripgrep: the same files, every kind of ignore file honoured."""
    argv = ["rg", "--files", "--hidden", "--no-require-git", "--glob", "!.git", "--", start]
    given = 0
    with _Process(argv, root, budget) as proc:
        for line in proc.lines():
            path = line.rstrip("\n")
            given += 1
            yield path[2:] if path.startswith("./") else path
    if proc.popen.returncode == 2 and not given and not budget.expired:
        raise RgFailed(proc.stderr.decode("utf-8", "replace"))


class _Process:
    """A child killed at the deadline (its pipe then ends, so a blocked read returns)."""

    def __init__(self, argv: list[str], cwd: str, budget: Budget) -> None:
        import subprocess  # only with rg: most calls never start a process
        import threading

        self.popen = subprocess.Popen(
            argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        remaining = max(0.0, budget.deadline - time.monotonic())
        self.timer = threading.Timer(remaining, self._expire, (budget,))
        self.timer.daemon = True
        self.timer.start()
        self.stderr = b""

    def _expire(self, budget: Budget) -> None:
        budget.expired = True
        self.popen.kill()

    def lines(self) -> Iterator[str]:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            yield raw.decode("utf-8", "surrogateescape")

    def __enter__(self) -> _Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer.cancel()
        if self.popen.poll() is None:
            self.popen.kill()
        assert self.popen.stderr is not None
        self.stderr = self.popen.stderr.read(16384)
        self.popen.wait()


# -- the two operations ---------------------------------------------------------------------------


def do_glob(req: dict[str, Any], root: str, start: str, engine: str, budget: Budget) -> dict[str, Any]:
    """Files under ``start`` whose path relative to it matches the pattern, newest first."""
    pattern = str(req["pattern"])
    regex = compile_glob(pattern)
    prefix = "" if start == "." else start + "/"
    found: list[tuple[float, str]] = []
    files = rg_files(root, start, budget) if engine == "rg" else walk(root, start, budget)
    scanned = 0
    for path in files:
        scanned += 1
        if not path.startswith(prefix) or not regex.fullmatch(path[len(prefix) :]):
            continue
        try:
            mtime = os.lstat(os.path.join(root, path)).st_mtime
        except OSError:
            continue
        found.append((mtime, path))
    found.sort(key=lambda item: (-item[0], item[1]))
    limit = int(req["max_results"])
    return {
        "paths": [path for _, path in found[:limit]],
        "total": len(found),
        "scanned": scanned,
        "timed_out": budget.expired,
    }


class Matcher:
    """What grep looks for: the regex, and the file filter of its ``glob``."""

    def __init__(self, req: dict[str, Any], start: str) -> None:
        flags = re.MULTILINE | (re.IGNORECASE if req.get("ignore_case") else 0)
        try:
            self.regex = re.compile(str(req["pattern"]), flags)
        except re.error as exc:
            where = f" at position {exc.pos}" if exc.pos is not None else ""
            raise SearchError("bad_regex", f"invalid regular expression: {exc.msg}{where}") from None
        file_glob = req.get("glob")
        self.glob = compile_glob(file_glob) if file_glob else None
        self.glob_by_name = bool(file_glob) and "/" not in str(file_glob)
        self.prefix = "" if start == "." else start + "/"

    def wants(self, path: str) -> bool:
        """Whether the file at workspace path ``path`` passes the ``glob`` filter."""
        if self.glob is None:
            return True
        subject = path.rsplit("/", 1)[-1] if self.glob_by_name else path[len(self.prefix) :]
        return self.glob.fullmatch(subject) is not None


class Collector:
    """Gathers grep's lines, in order, up to ``max_results`` matches (and their context)."""

    def __init__(self, max_results: int, max_line: int, context: int) -> None:
        self.lines: list[Line] = []
        self.context = context
        self.matches = 0
        self.files = 0
        self.max_results = max_results
        self.max_line = max_line
        self.full = False
        self.more = False  # max_results reached
        self.cut = False  # MAX_ANSWER_CHARS reached
        self.chars = 0
        self._last: tuple[str, int] | None = None
        self._matched = ""  # the file of the last match

    def add(self, path: str, number: int, text: str, is_match: bool) -> None:
        last = self._last
        if self.context and last is not None and (last[0] != path or number > last[1] + 1):
            self.lines.append(None)
        if is_match and path != self._matched:
            self.files += 1
            self._matched = path
        if len(text) > self.max_line:
            text = text[: self.max_line] + " [... line cut ...]"
        if text.endswith("\r"):
            text = text[:-1]  # a CRLF file's line, shown as the line
        self.lines.append([path, number, is_match, text])
        self.chars += len(path) + len(text) + 16
        self._last = (path, number)
        if is_match:
            self.matches += 1
            self.more = self.matches >= self.max_results
        self.cut = self.chars >= MAX_ANSWER_CHARS
        self.full = self.more or self.cut


def grep_file(data: bytes, path: str, matcher: Matcher, context: int, out: Collector) -> None:
    """The matching lines of one file (and ``context`` lines around them), into ``out``."""
    text = data.decode("utf-8", "replace")
    if matcher.regex.search(text) is None:
        return  # most files: one pass of the regex over the whole text, no line split
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    shown_until = -1  # index of the last line already emitted
    pending_after = 0
    for index, line in enumerate(lines):
        if matcher.regex.search(line) is not None:
            if out.full:
                return
            for before in range(max(shown_until + 1, index - context), index):
                out.add(path, before + 1, lines[before], False)
            out.add(path, index + 1, line, True)
            shown_until = index
            pending_after = context
        elif pending_after:
            out.add(path, index + 1, line, False)
            shown_until = index
            pending_after -= 1
        elif out.full:
            return


def read_text_file(root: str, path: str) -> bytes | None:
    """The file's bytes, or None when it is binary, too large or unreadable."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # no link, no fifo
    try:
        fd = os.open(os.path.join(root, path), flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            return None
        # Sized reads: a buffer of the file's size, not of the cap (most files are small).
        chunks = [os.read(fd, info.st_size + 1)]
        total = len(chunks[0])
        while total > info.st_size and chunks[-1] and total <= MAX_FILE_BYTES:  # it grew since fstat
            chunks.append(os.read(fd, 1 << 20))
            total += len(chunks[-1])
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_FILE_BYTES or b"\x00" in data[:SNIFF]:
        return None
    return data


def do_grep(req: dict[str, Any], root: str, start: str, engine: str, budget: Budget) -> dict[str, Any]:
    """Lines matching the regex in the files under ``start``, in walk order."""
    matcher = Matcher(req, start)
    context = int(req.get("context_lines") or 0)
    out = Collector(int(req["max_results"]), int(req["max_line"]), context)
    if engine == "rg":
        _rg_grep(req, root, start, matcher, context, out, budget)
    else:
        skipped = 0
        for path in walk(root, start, budget):
            if out.full:
                break
            if not matcher.wants(path):
                continue
            data = read_text_file(root, path)
            if data is None:
                skipped += 1
                continue
            grep_file(data, path, matcher, context, out)
    return {
        "lines": out.lines,
        "matches": out.matches,
        "files": out.files,
        "more": out.more,
        "cut": out.cut,
        "timed_out": budget.expired,
    }


def _rg_grep(
    req: dict[str, Any],
    root: str,
    start: str,
    matcher: Matcher,
    context: int,
    out: Collector,
    budget: Budget,
) -> None:
    argv = ["rg", "--json", "--sort", "path", "--hidden", "--no-require-git", "--glob", "!.git"]
    argv += ["--max-filesize", str(MAX_FILE_BYTES)]
    if req.get("ignore_case"):
        argv.append("--ignore-case")
    if context:
        argv += ["--context", str(context)]
    if req.get("glob"):
        argv += ["--glob", str(req["glob"])]
    argv += ["--regexp", str(req["pattern"]), "--", start]
    with _Process(argv, root, budget) as proc:
        for line in proc.lines():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            kind = message.get("type")
            if kind not in ("match", "context"):
                continue
            data = message["data"]
            path = _rg_text(data["path"])
            path = path[2:] if path.startswith("./") else path
            if not matcher.wants(path):
                continue
            if kind == "match" and out.full:
                break
            text = _rg_text(data["lines"]).rstrip("\n").rstrip("\r")
            out.add(path, int(data["line_number"]), text, kind == "match")
    if proc.popen.returncode == 2 and not out.lines and not budget.expired:
        raise RgFailed(proc.stderr.decode("utf-8", "replace"))


def _rg_text(field: dict[str, Any]) -> str:
    if "text" in field:
        return str(field["text"])
    import base64

    return base64.b64decode(field.get("bytes", "")).decode("utf-8", "replace")


# -- entry point ----------------------------------------------------------------------------------


def serve(req: dict[str, Any]) -> dict[str, Any]:
    """Answer one request: ``{"op": "glob"|"grep", "root", "path", ...}``."""
    root = os.path.realpath(str(req["root"]))
    start = str(req.get("path") or ".")
    target = os.path.realpath(os.path.join(root, start))
    if target != root and not target.startswith(root + os.sep):
        raise SearchError("escape", f"{start!r} is outside the workspace")
    start = "." if target == root else os.path.relpath(target, root).replace(os.sep, "/")
    if not os.path.exists(target):
        raise SearchError("ENOENT", f"{start} does not exist")
    engine = str(req.get("engine") or "auto")
    if engine == "auto":
        engine = "rg" if _on_path("rg") else "python"
    budget = Budget(float(req["time_limit"]))
    if os.path.isfile(target) and req["op"] == "grep":
        answer = _grep_one(req, root, start, budget)
    elif not os.path.isdir(target):
        what = "a file: glob searches a directory (give its parent)" if req["op"] == "glob" else "not a file"
        raise SearchError("not_a_directory", f"{start} is {what}")
    else:
        run = do_glob if req["op"] == "glob" else do_grep
        try:
            answer = run(req, root, start, engine, budget)
        except RgFailed as exc:
            engine = "python"
            answer = run(req, root, start, engine, budget)
            answer["rg_error"] = str(exc).strip()[-500:]
    answer["engine"] = engine
    return answer


def _on_path(name: str) -> bool:
    """Whether an executable ``name`` is on PATH (``shutil.which`` without importing shutil)."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return True
    return False


def _grep_one(req: dict[str, Any], root: str, path: str, budget: Budget) -> dict[str, Any]:
    matcher = Matcher(req, ".")
    context = int(req.get("context_lines") or 0)
    out = Collector(int(req["max_results"]), int(req["max_line"]), context)
    data = read_text_file(root, path)
    if data is None:
        raise SearchError(
            "binary", f"{path} is binary, larger than {MAX_FILE_BYTES >> 20} MiB, or unreadable"
        )
    grep_file(data, path, matcher, context, out)
    return {
        "lines": out.lines,
        "matches": out.matches,
        "files": out.files,
        "more": out.more,
        "cut": out.cut,
        "timed_out": False,
    }


def main() -> None:
    """Read the request from the environment, write the answer (or the error) as JSON."""
    try:
        answer = serve(json.loads(os.environ["DISPATCHER_SEARCH"]))
    except SearchError as exc:
        answer = {"error": exc.code, "message": str(exc)}
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
