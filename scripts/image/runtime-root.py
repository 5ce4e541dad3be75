"""The image's runtime root: from the build base's tarball (mmdebstrap), the files of the few Debian packages the agent
runs on (Python, the C libraries its modules load, the CA bundle), without a shell, a package manager or docs beyond
the licences; written as a reproducible tarball (sorted, numeric owners, mtimes clamped to SOURCE_DATE_EPOCH).

    python3 scripts/image/runtime-root.py BASE.tar RUNTIME.tar [--epoch N] [--with PACKAGE]...

Every hard dependency of a carried package is carried or named in LEFT_OUT with the reason; every ELF file carried
finds the libraries it needs in the root: a Debian update that adds a dependency fails the build here, not the agent at
run time. /var/lib/dpkg/status lists the carried packages (image scanners read it), with this root's files only.
Standard library only (it runs on the build host).
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import os
import posixpath
import re
import struct
import sys
import tarfile
from collections.abc import Iterable

# Debian package -> why the image carries it.
PACKAGES = {
    "base-files": "/etc/os-release (what image scanners read) and the licences",
    "libc6": "the C library",
    "libgcc-s1": "glibc loads it to unwind a thread that exits",
    "gcc-12-base": "the licence of libgcc-s1 and libstdc++6 (its only file)",
    "python3.11-minimal": "the interpreter",
    "python3-minimal": "/usr/bin/python3, which the image's virtual environment links to",
    "libpython3.11-minimal": "the core standard library",
    "libpython3.11-stdlib": "the rest of the standard library (what the agent does not use is excluded below)",
    "zlib1g": "zlib and gzip (the /metrics server compresses)",
    "libssl3": "ssl and hashlib (OTLP, notifiers and the metrics server over TLS)",
    "libffi8": "ctypes (NVML through nvidia-ml-py)",
    "libexpat1": "pyexpat",
    "libbz2-1.0": "bz2",
    "liblzma5": "lzma",
    "libuuid1": "_uuid",
    "libstdc++6": "the C++ runtime of the protobuf and google-re2 wheels' extension modules",
    "media-types": "/etc/mime.types for mimetypes",
}
# A hard dependency of a carried package that the image leaves out -> why.
LEFT_OUT = {
    "awk": "base-files' maintainer scripts; nothing runs them in the image",
    "mawk": "the same",
    "dpkg": "no package manager in the image",
    "ca-certificates": "its generated bundle is carried (EXTRA), not the tools that make it",
    "openssl": "the command-line tool; only its default paths are carried (EXTRA)",
    "debconf": "the same as dpkg",
    "libcrypt1": "the crypt module (deprecated, unused)",
    "libdb5.3": "dbm.ndbm (unused)",
    "libncursesw6": "curses (unused)",
    "libtinfo6": "curses and readline (unused)",
    "libreadline8": "readline: the image has no interactive interpreter",
    "readline-common": "the same",
    "libnsl2": "nis (unused)",
    "libtirpc3": "nis, through libnsl2",
    "libsqlite3-0": "sqlite3 (unused)",
    "mime-support": "media-types provides /etc/mime.types",
}
# Paths of carried packages that the image leaves out (fnmatch patterns on the path without its leading "/").
EXCLUDE = [
    "usr/lib/*/gconv/*",  # iconv's charset modules: Python decodes with its own codecs
    "usr/lib/*/audit/*",
    "usr/lib/*/libthread_db*",  # a debugger's plugin (it needs the debugger's symbols)
    "usr/share/lintian/*",
    "usr/share/man/*",
    "usr/share/doc/*/*",  # but the copyright files (INCLUDE)
    "usr/share/binfmts/*",
    "usr/share/pixmaps/*",
    "usr/share/applications/*",
    "usr/share/python3/*",  # debpython's tools
    "usr/bin/py3*",
    "usr/bin/pydoc*",
    "usr/lib/python3.11/test/*",
    "usr/lib/python3.11/idlelib/*",
    "usr/lib/python3.11/pydoc_data/*",
    "usr/lib/python3.11/ensurepip/*",
    "usr/lib/python3.11/venv/*",
    "usr/lib/python3.11/__phello__/*",
    "usr/lib/python3.11/turtle*",
    "usr/lib/python3.11/lib-dynload/_test*",
    "usr/lib/python3.11/lib-dynload/_ctypes_test*",
    "usr/lib/python3.11/lib-dynload/xxlimited*",
    "usr/lib/python3.11/lib-dynload/_xx*",
    # the modules whose C libraries are left out (LEFT_OUT)
    "usr/lib/python3.11/sqlite3/*", "usr/lib/python3.11/lib-dynload/_sqlite3.*",
    "usr/lib/python3.11/curses/*", "usr/lib/python3.11/lib-dynload/_curses*",
    "usr/lib/python3.11/lib-dynload/readline.*",
    "usr/lib/python3.11/lib-dynload/_dbm.*",
    "usr/lib/python3.11/lib-dynload/nis.*",
    "usr/lib/python3.11/lib-dynload/_crypt.*", "usr/lib/python3.11/crypt.py",
]
INCLUDE = ["usr/share/doc/*/copyright"]
# Files of the base that no package lists (made by maintainer scripts) or that come from a package left out.
EXTRA = [
    "etc/passwd", "etc/group", "etc/nsswitch.conf",
    "etc/ssl/certs/ca-certificates.crt", "etc/ssl/openssl.cnf",
    "usr/lib/ssl/cert.pem", "usr/lib/ssl/certs", "usr/lib/ssl/openssl.cnf",
    "bin", "lib", "lib64",  # merged /usr (the root carries nothing under /usr/sbin)
]
# Empty directories of a root filesystem (mount points, a scratch /tmp): name -> mode.
SKELETON = {"dev": 0o755, "proc": 0o555, "sys": 0o555, "run": 0o755, "tmp": 0o1777, "var/tmp": 0o1777,
            "root": 0o700, "etc/ssl/certs": 0o755}


def parse_status(text: str) -> dict[str, str]:
    """dpkg's status file: package name -> its stanza."""
    out = {}
    for stanza in text.strip().split("\n\n"):
        m = re.search(r"^Package: (\S+)$", stanza, re.M)
        if m:
            out[m.group(1)] = stanza.strip()
    return out


def dependencies(stanza: str) -> set[str]:
    """The package names a stanza's Depends and Pre-Depends name (each alternative of an `a | b` group)."""
    names = set()
    for m in re.finditer(r"^(?:Pre-)?Depends: (.*)$", stanza, re.M):
        for group in m.group(1).split(","):
            for alt in group.split("|"):
                names.add(alt.strip().split()[0].split(":")[0])
    return names


class Base:
    """The base tarball's members by normalised path ("usr/lib/x"), with directory symlinks resolved."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.members = {norm(m.name): m for m in tar.getmembers()}

    def read(self, path: str) -> bytes:
        f = self.tar.extractfile(self.members[path])
        assert f is not None, path
        return f.read()

    def resolve(self, path: str, last: bool = False, depth: int = 0) -> str:
        """The path with each symlinked directory in it replaced by the link's target (the last component too when
        `last`): where the file lies in this tree (merged /usr: /lib/x86_64-linux-gnu/libc.so.6 is under usr/lib)."""
        parts = path.split("/")
        done: list[str] = []
        for i, part in enumerate(parts):
            done.append(part)
            m = self.members.get("/".join(done))
            if m is not None and m.issym() and (last or i < len(parts) - 1):
                if depth > 40:
                    raise SystemExit(f"runtime-root: symlink loop at {path}")
                target = m.linkname if m.linkname.startswith("/") else posixpath.join("/", *done[:-1], m.linkname)
                done = self.resolve(norm(target), last=True, depth=depth + 1).split("/")
        return "/".join(done)


def norm(name: str) -> str:
    return posixpath.normpath("/" + name).lstrip("/")


def package_files(base: Base, package: str) -> list[str]:
    for name in (f"var/lib/dpkg/info/{package}.list", f"var/lib/dpkg/info/{package}:amd64.list",
                 f"var/lib/dpkg/info/{package}:arm64.list"):
        if name in base.members:
            return [norm(line) for line in base.read(name).decode().splitlines() if norm(line)]
    raise SystemExit(f"runtime-root: package {package} is not installed in the base")


def excluded(path: str) -> bool:
    return any(fnmatch.fnmatch(path, p) for p in EXCLUDE) and not any(fnmatch.fnmatch(path, p) for p in INCLUDE)


def needed_libraries(data: bytes) -> list[str] | None:
    """DT_NEEDED of an ELF file (64- or 32-bit, either byte order); None when it is not a dynamic ELF object."""
    if data[:4] != b"\x7fELF":
        return None
    bits, order = data[4], "<" if data[5] == 1 else ">"
    if bits == 2:
        shoff, = struct.unpack_from(order + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
        section = order + "IIQQQQIIQQ"
        dyn, dynsize = order + "qQ", 16
    else:
        shoff, = struct.unpack_from(order + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x2E)
        section = order + "IIIIIIIIII"
        dyn, dynsize = order + "iI", 8
    sections = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for _name, sh_type, _flags, _addr, offset, size, link, *_ in sections:
        if sh_type != 6:  # SHT_DYNAMIC
            continue
        strtab = sections[link][4]
        for pos in range(offset, offset + size, dynsize):
            tag, val = struct.unpack_from(dyn, data, pos)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strtab + val)
                out.append(data[strtab + val:end].decode())
        return out
    return None


def select(base: Base, packages: Iterable[str]) -> tuple[set[str], dict[str, str]]:
    """The paths the runtime root carries, and the carried packages' stanzas."""
    status = parse_status(base.read("var/lib/dpkg/status").decode())
    packages = sorted(packages)
    missing = []
    for package in packages:
        if package not in status:
            raise SystemExit(f"runtime-root: package {package} is not installed in the base")
        for dep in sorted(dependencies(status[package])):
            if dep not in packages and dep not in LEFT_OUT:
                missing.append(f"{package} depends on {dep}")
    if missing:
        raise SystemExit("runtime-root: dependencies neither carried nor left out on purpose (add each to PACKAGES "
                         "or LEFT_OUT in scripts/image/runtime-root.py):\n  " + "\n  ".join(missing))
    paths: set[str] = set()
    for package in packages:
        for listed in package_files(base, package):
            path = base.resolve(listed)
            m = base.members.get(path)
            if m is None or m.isdir() or excluded(path):
                continue  # directories come with their contents; the dpkg-excluded files were never unpacked
            paths.add(path)
            if path.endswith(".py"):  # the byte code compiled at install (hash-checked: SOURCE_DATE_EPOCH)
                head, name = posixpath.split(path)
                pyc = f"{head}/__pycache__/{name[:-3]}.cpython-311.pyc"
                if pyc in base.members:
                    paths.add(pyc)
    for extra in EXTRA:
        if extra not in base.members:
            raise SystemExit(f"runtime-root: {extra} is not in the base")
        paths.add(extra)
    return paths, {p: status[p] for p in packages}


def check_libraries(base: Base, paths: set[str]) -> None:
    """Every ELF file carried finds each library it needs among the carried files (by name, in the library dirs)."""
    have = {posixpath.basename(p) for p in paths if "/lib" in "/" + p}
    problems = []
    for path in sorted(paths):
        m = base.members[path]
        if not m.isfile():
            continue
        needed = needed_libraries(base.read(path)) if m.size > 64 else None
        for lib in needed or ():
            if lib not in have:
                problems.append(f"{path} needs {lib}")
    if problems:
        raise SystemExit("runtime-root: libraries missing from the root (carry their package, or exclude the file "
                         "that needs them):\n  " + "\n  ".join(problems))


def write(base: Base, paths: set[str], stanzas: dict[str, str], out: str, epoch: int) -> int:
    """The tarball: the files with their directories, the skeleton, the status file; sorted, numeric owners, mtimes
    clamped to epoch; a hard link becomes a copy (its target may be left out, or sort after it). Returns the bytes of
    file data. A symlink whose target is not carried is left out."""
    entries: dict[str, tarfile.TarInfo] = {}
    data: dict[str, bytes] = {}
    dirs = set(SKELETON)
    for path in paths:
        parent = posixpath.dirname(path)
        while parent:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    for path in sorted(paths):
        m = base.members[path]
        if m.issym() and base.resolve(path, last=True) not in paths | dirs:
            print(f"runtime-root: leaving out {path} -> {m.linkname} (its target is not carried)", file=sys.stderr)
            continue
        source = base.members[norm(m.linkname)] if m.islnk() else m
        entries[path] = _copy(source)
        if source.isfile():
            data[path] = base.read(norm(source.name))
    for path in dirs:
        m = base.members.get(path)
        entries[path] = _copy(m) if m is not None and m.isdir() else _dir(path, SKELETON.get(path, 0o755))
    status = ("\n\n".join(stanzas[p] for p in sorted(stanzas)) + "\n").encode()
    entries["var/lib/dpkg/status"] = _file(len(status))
    data["var/lib/dpkg/status"] = status

    with open(out + ".tmp", "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in sorted(entries):
            info = entries[path]
            info.name = path
            info.mtime = min(int(info.mtime), epoch)
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data[path]) if info.isfile() else None)
    os.replace(out + ".tmp", out)
    return sum(len(d) for d in data.values())


def _copy(m: tarfile.TarInfo) -> tarfile.TarInfo:
    info = tarfile.TarInfo(m.name)
    for attr in ("size", "mtime", "mode", "type", "linkname", "uid", "gid", "devmajor", "devminor"):
        setattr(info, attr, getattr(m, attr))
    info.pax_headers = {}
    return info


def _dir(path: str, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path)
    info.type, info.mode = tarfile.DIRTYPE, mode
    return info


def _file(size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo()
    info.size, info.mode = size, 0o644
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base")
    parser.add_argument("out")
    parser.add_argument("--epoch", type=int, default=int(os.environ.get("SOURCE_DATE_EPOCH", "0")))
    parser.add_argument("--with", dest="extra_packages", action="append", default=[],
                        help="carry this package too")
    args = parser.parse_args()
    with tarfile.open(args.base) as tar:
        base = Base(tar)
        paths, stanzas = select(base, [*PACKAGES, *args.extra_packages])
        check_libraries(base, paths)
        size = write(base, paths, stanzas, args.out, args.epoch)
    print(f"runtime-root: {len(paths)} files, {size / 1e6:.1f} MB, packages: {' '.join(sorted(stanzas))}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
