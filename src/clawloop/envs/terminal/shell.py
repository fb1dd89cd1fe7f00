"""The terminal track's persistent shell: one interactive bash per episode in the sandbox, read by a thread.

The shell runs with PS1 empty and a PROMPT_COMMAND that prints a random marker
with `$?` and `$PWD`, so the end of every command (even one aborted by an
expansion error) is seen in the output stream; commands are sent as one
`eval $'...'` line, so a syntax error cannot leave bash waiting for more input
and a program reading stdin gets only what the agent writes to it. A watchdog
kills the shell when the workspace keeps growing past its quota or the
episode's processes near their limit (a fork bomb). Each command's output is
kept as a head and a tail (`CHUNK_HEAD`, `CHUNK_TAIL`), so `yes` cannot fill
the host's memory.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field

from clawloop.envs.sandbox import Sandbox, descendants

CHUNK_HEAD = 16 * 1024
CHUNK_TAIL = 48 * 1024
"""Bytes of one command's output kept in memory (head and tail; `yes` must not fill the host's memory)."""
WATCH_EVERY_S = 0.5
# Interactive bash without a terminal complains so whenever a job dies of a signal (`yes | head`).
_NOISE = re.compile(r"^bash: \[\d+: \d+ \(\d+\)\] tcsetattr: Inappropriate ioctl for device\n", re.M)


# ---- the persistent shell ----------------------------------------------------------------------

@dataclass
class Chunk:
    """Output of one command (or, between commands, of background jobs): head and tail kept."""
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    dropped: int = 0
    exit: tuple[int, str] | None = None
    """(exit code, working directory) once the command ended."""

    def add(self, data: bytes) -> None:
        room = CHUNK_HEAD - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > CHUNK_TAIL:
            extra = len(self.tail) - CHUNK_TAIL
            del self.tail[:extra]
            self.dropped += extra

    def text(self) -> str:
        cut = f"\n[... {self.dropped} bytes of output cut ...]\n".encode() if self.dropped else b""
        return _NOISE.sub("", bytes(self.head + cut + self.tail).decode("utf-8", "replace"))


class Shell:
    """One interactive bash in the sandbox, read by a thread into chunks split at the end markers."""

    def __init__(self, sandbox: Sandbox, cwd: str, start_timeout_s: float = 30.0):
        self.sandbox = sandbox
        self.cwd = cwd
        self.killed = ""
        """Why the watchdog (or the env) killed the shell; "" when it ended on its own."""
        token = secrets.token_hex(8)
        # Printed as two words joined by printf, so the marker never appears in a `set -x` trace.
        self._marker = re.compile(rb"\n__CLAWLOOP_" + token.encode() + rb"__ (\d+) ([^\n]*)\n")
        self._prefix = b"\n__CLAWLOOP_" + token.encode() + b"__ "
        self._chunks = [Chunk()]
        self._pending = bytearray()
        self._eof = False
        self._cond = threading.Condition()
        self.busy = False
        try:
            self.proc = sandbox.spawn("exec bash --noprofile --norc --noediting -i")
        except OSError as e:
            raise RuntimeError(f"cannot start bash in the sandbox: {e}") from e
        threading.Thread(target=self._read, name="terminal-shell-read", daemon=True).start()
        threading.Thread(target=self._watch, name="terminal-shell-watch", daemon=True).start()
        self.send(f"PS1=; PS2=; unset HISTFILE; set +H; PROMPT_COMMAND='printf \"\\n%s%s %s %s\\n\" "
                  f"__CLAWLOOP_ {token}__ \"$?\" \"$PWD\"'; cd {shlex.quote(cwd)}")
        self.busy = True
        self.wait(start_timeout_s)
        _, _, state = self.collect()
        if state != "done":
            out = self.drain()
            self.kill("did not start")
            raise RuntimeError(f"bash did not start in the sandbox ({state}): {out.strip()[-500:]}")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and not self._eof

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            with self._cond:
                if not data:
                    self._eof = True
                    self._chunks[-1].add(bytes(self._pending))
                    self._pending.clear()
                    self._cond.notify_all()
                    break
                self._pending += data
                while (m := self._marker.search(self._pending)) is not None:
                    self._chunks[-1].add(bytes(self._pending[:m.start()]))
                    self._chunks[-1].exit = (int(m.group(1)), m.group(2).decode("utf-8", "replace"))
                    self._chunks.append(Chunk())
                    del self._pending[:m.end()]
                # Hold back only what may be the start of a marker split across reads.
                i = self._pending.rfind(b"\n")
                keep = 0
                if i >= 0:
                    rest = bytes(self._pending[i:])
                    if self._prefix.startswith(rest) or (rest.startswith(self._prefix) and re.fullmatch(
                            rb"\d*( [^\n]*)?", rest[len(self._prefix):])):
                        keep = len(rest)
                self._chunks[-1].add(bytes(self._pending[:len(self._pending) - keep]))
                del self._pending[:len(self._pending) - keep]
                self._cond.notify_all()
        self.proc.stdout.close()

    def _watch(self) -> None:
        """Kill a shell whose workspace keeps growing past the quota, or that nears the process limit.
        Growing, not just over: after a kill the agent must be able to start a shell and clean up."""
        lim = self.sandbox.limits
        quota = lim.disk_mb << 20
        last = self.sandbox.workspace_bytes() if quota else 0
        crowded, spent = 0, 0.0
        while self.proc.poll() is None:
            time.sleep(max(WATCH_EVERY_S, 10 * spent))  # a workspace of many files is walked less often
            if self.proc.poll() is not None:
                return
            t0 = time.monotonic()
            if quota:
                used = self.sandbox.workspace_bytes()
                if used > quota and used > last:
                    self.kill(f"disk quota: the workspace grew past {lim.disk_mb} MB")
                    return
                last = used
            # A fork bomb holds every process the sandbox user may have; two checks in a row say it is not a blip.
            crowded = crowded + 1 if len(descendants(self.proc.pid)) >= lim.max_procs * 3 // 4 else 0
            if crowded >= 2:
                self.kill(f"process limit: the shell's processes neared the limit of {lim.max_procs}")
                return
            spent = time.monotonic() - t0

    def send(self, line: str, timeout_s: float = 10.0) -> str:
        """Write a line to the shell's stdin: "" when written, else why not. Non-blocking with a
        deadline: a program that does not read its input must not hang the env on a full pipe."""
        assert self.proc.stdin is not None
        data = memoryview(line.encode("utf-8", "surrogateescape") + b"\n")
        deadline = time.monotonic() + timeout_s
        try:
            fd = self.proc.stdin.fileno()
            os.set_blocking(fd, False)
            while data:
                try:
                    data = data[os.write(fd, data):]
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        return f"input not taken within {timeout_s:g} s ({len(data)} bytes left unsent)"
                    time.sleep(0.05)
        except (OSError, ValueError):
            return "the shell ended"
        return ""

    def run(self, command: str) -> str:
        """Start `command` (as `eval $'...'`: one line, whatever its quotes and newlines)."""
        safe = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ._-/=:,+@%"
        quoted = "".join(chr(b) if b in safe else f"\\x{b:02x}" for b in command.encode("utf-8", "surrogateescape"))
        self.busy = True
        return self.send(f"eval $'{quoted}'")

    def wait(self, timeout_s: float, settle_s: float | None = None) -> None:
        """Until the current command ends, the shell dies, `timeout_s` passes, or (with `settle_s`)
        new output came and then nothing for `settle_s`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            size = self._size()
            quiet_since = None
            while True:
                if (self.busy and self._chunks[0].exit is not None) or self._eof:
                    return
                now = time.monotonic()
                if now >= deadline:
                    return
                if settle_s is not None:
                    if self._size() != size:
                        size, quiet_since = self._size(), now
                    elif quiet_since is not None and now - quiet_since >= settle_s:
                        return
                self._cond.wait(min(0.1, deadline - now))

    def _size(self) -> int:
        c = self._chunks[0]
        return len(c.head) + len(c.tail) + c.dropped + len(self._chunks)

    def collect(self) -> tuple[str, int | None, str]:
        """(output so far, exit code or None, "done" | "running" | "dead") of the current command."""
        with self._cond:
            first = self._chunks[0]
            if first.exit is not None:
                self._chunks.pop(0)
                self.busy = False
                self.cwd = first.exit[1] or self.cwd
                return first.text(), first.exit[0], "done"
            self._chunks[0] = Chunk()
            if not self.alive:
                self.busy = False
                return first.text(), None, "dead"
            return first.text(), None, "running"

    def drain(self) -> str:
        """Everything not read yet (background output between commands), exit codes noted."""
        with self._cond:
            # Between commands no marker is on its way: a held-back newline is plain output.
            self._chunks[-1].add(bytes(self._pending))
            self._pending.clear()
            parts = []
            for c in self._chunks:
                parts.append(c.text())
                if c.exit is not None:
                    parts.append(f"\n[exit code {c.exit[0]}]\n")
                    self.cwd = c.exit[1] or self.cwd
            self._chunks = [Chunk()]
            return "".join(parts)

    def finished(self) -> bool:
        with self._cond:
            return self._chunks[0].exit is not None

    def end_note(self) -> str:
        if self.killed:
            return f"the shell was killed ({self.killed})"
        try:  # its output closes just before it is reaped
            return f"the shell exited (code {self.proc.wait(timeout=2)})"
        except subprocess.TimeoutExpired:
            return "the shell's output closed"

    def kill(self, reason: str) -> None:
        if self.proc.poll() is None and not self.killed:
            self.killed = reason
        self.sandbox.kill(self.proc)
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
