"""Who a watched process is: its user, command (the program and its script unless more is asked for:
collectors/cmdline.py) and start time, for the per-process tables (nvitop's columns).

Read once per process while it holds a top-N slot (pid and start ticks identify it across pid reuse), so a sweep
pays for a process's identity only when it first appears. The user is the name the agent's own passwd database
gives the uid, else the uid itself (a container that does not know the host's users).
"""

from __future__ import annotations

import pwd
from collections.abc import Iterable, Mapping

from outrider.collectors.cmdline import command_label
from outrider.kernel import procfs
from outrider.metrics.family import Family

MAX_COMMAND = 128  # a label value, not a log line: the first characters say which script it is

Key = tuple[int, int]  # (pid, start ticks)


class ProcessIdentities:
    def __init__(self, root: str, *, arguments: bool = False, full_command: bool = False) -> None:
        self._root = root
        self._arguments = arguments  # opt-in: the arguments too, redacted (collectors/cmdline.py)
        self._full_command = full_command  # opt-in: the command line unredacted
        self._boot: float | None = None
        self._known: dict[Key, tuple[str, str]] = {}
        self._users: dict[int, str] = {}

    def _boot_time(self) -> float:
        if self._boot is None:
            self._boot = procfs.read_boot_time(self._root)
        return self._boot

    def _user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self._users[uid] = name
        return name

    def _identity(self, key: Key, name: str) -> tuple[str, str] | None:
        known = self._known.get(key)
        if known is None:
            try:
                # the real uid: who started it, also where a setuid program runs with another's rights
                user = self._user(procfs.read_proc_uids(self._root, key[0]).real)
                argv = procfs.read_proc_argv(self._root, key[0])
            except (OSError, ValueError, IndexError):
                return None  # gone meanwhile, or not ours to read: shown without its identity
            command = (command_label(argv, MAX_COMMAND, arguments=self._arguments, full=self._full_command)
                       if argv else f"[{name}]")
            known = self._known[key] = (user, command)
        return known

    def families(self, shown: Iterable[Key], names: Mapping[Key, str]) -> list[Family]:
        """outrider_process_start_time_seconds and outrider_process_info of the processes shown one by one."""
        start = Family("outrider_process_start_time_seconds")
        info = Family("outrider_process_info")
        keys = list(shown)
        try:
            boot: float | None = self._boot_time()
        except (OSError, ValueError):
            boot = None
        for key in keys:
            pid, name = str(key[0]), names[key]
            if boot is not None:
                start.add(boot + key[1] / procfs.CLOCK_TICKS, pid, name)
            identity = self._identity(key, name)
            if identity is not None:
                info.add(1, pid, name, *identity)
        live = set(keys)
        for key in [k for k in self._known if k not in live]:
            del self._known[key]
        return [start, info]
