"""The system-call filter of a sandboxed evaluation: a classic-BPF seccomp program, built here without
libseccomp, handed to bubblewrap (``--seccomp FD``), which installs it right before it executes the worker.

What a heuristic never needs is refused with ``EPERM`` (:data:`DENIED`): the kernel keyring
(``keyctl``, ``add_key``, ``request_key`` -- a user keyring outlives the processes that wrote it, so an
evaluation could leave data for the next one), new namespaces (``unshare``, ``setns``, and ``clone`` with
any ``CLONE_NEW*`` flag -- a new user namespace would give the candidate its own mounts and tmpfs, outside
the memory accounting of its sandbox), mounts, ``ptrace`` and cross-process memory access, ``bpf``,
``perf_event_open``, ``userfaultfd``, ``io_uring`` (its operations bypass the filter), kernel modules,
reboot, clock, host name and swap changes, and whatever makes the host's page cache a store shared by
every evaluation (``fadvise64``, ``readahead``, ``mincore``, ``cachestat``, ``process_madvise``, ``madvise``
with ``MADV_COLD`` / ``MADV_PAGEOUT``, ``preadv2`` / ``pwritev2`` with ``RWF_NOWAIT``: set, clear or read
whether a page of a read-only file is cached, one bit per page; issue 45), and what issue 54 found past
those: Linux AIO (``io_setup`` ... ``io_pgetevents``: ``RWF_NOWAIT`` reads through it, and its event table
is host-wide), ``inotify`` / ``fanotify`` (one evaluation watching another's opens of a shared file), file
locks (``flock``, and ``fcntl`` with ``F_GETLK`` / ``F_SETLK`` / ``F_SETLKW``, their ``F_OFD_*`` and 64-bit
forms, leases and ``F_NOTIFY``: a lock on a shared read-only file is seen by every evaluation), ``sysinfo``
(host uptime, load, RAM, process count), ``madvise`` with ``MADV_WILLNEED`` / ``MADV_POPULATE_READ`` /
``MADV_POPULATE_WRITE`` (they load a shared file's pages), ``mmap`` of a file with ``MAP_SHARED`` (a futex
on such a mapping is keyed by the file's inode, so two evaluations mapping the same read-only library
file could wait and wake each other; private and anonymous mappings stay allowed), ``fcntl(F_SETPIPE_SZ)``
(pipe buffers count against a per-user quota the trusted side shares when it is not root), ``sync`` /
``syncfs`` (host-wide writeback), ``prctl(PR_SET_PDEATHSIG)`` (a worker clearing its parent-death signal
would outlive the process watching it); ``socket`` / ``socketpair``
of any family but :data:`SOCKET_FAMILIES` (``AF_VSOCK`` reaches the hypervisor). ``clone3`` gets ``ENOSYS`` (its flags sit in memory a filter
cannot read), so the C library falls back to ``clone``, whose flags are checked. A call from another ABI
(32-bit ``int 0x80`` on x86_64, the x32 ABI) kills the process: the numbers below would not apply to it.

Program layout (``struct sock_filter`` = ``<HBBI``, ``struct seccomp_data`` = nr @0, arch @4, args @16 + 8 i;
Linux ``Documentation/userspace-api/seccomp_filter.rst``): check the architecture, load the number, one
``JEQ`` per refused call, then per call whose arguments decide (``clone``'s flags, ``preadv2``'s flags,
``madvise``'s advice, ``socket``'s family, ``fcntl``'s command, ``mmap``'s flags, ``prctl``'s option) a jump to
a block that tests the argument's low 32 bits.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

# BPF opcodes (linux/filter.h, linux/bpf_common.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
# seccomp return actions (linux/seccomp.h)
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
RET_KILL_PROCESS = 0x80000000
# struct seccomp_data offsets
_NR, _ARCH, _ARG0 = 0, 4, 16

#: ``CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET`` (linux/sched.h)
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

#: ``RWF_NOWAIT`` (linux/fs.h): preadv2 / pwritev2 with it tell whether a page is cached without reading it in
RWF_NOWAIT = 0x00000008
#: madvise advice refused: ``MADV_COLD`` (20) and ``MADV_PAGEOUT`` (21) reclaim a shared file's cached pages,
#: ``MADV_WILLNEED`` (3), ``MADV_POPULATE_READ`` (22) and ``MADV_POPULATE_WRITE`` (23) load them (linux/mman.h)
MADV_DENIED = (3, 20, 21, 22, 23)
#: fcntl commands refused (asm-generic/fcntl.h, linux/fcntl.h): ``F_GETLK`` 5, ``F_SETLK`` 6, ``F_SETLKW`` 7,
#: ``F_GETLK64`` 12, ``F_SETLK64`` 13, ``F_SETLKW64`` 14, ``F_OFD_GETLK`` 36, ``F_OFD_SETLK`` 37,
#: ``F_OFD_SETLKW`` 38, ``F_SETLEASE`` 1024, ``F_GETLEASE`` 1025, ``F_NOTIFY`` 1026, ``F_SETPIPE_SZ`` 1031;
#: every other command (``F_GETFL``, ``F_SETFD``, ``F_DUPFD_CLOEXEC``, ...: what the interpreter uses) is allowed
FCNTL_DENIED = (5, 6, 7, 12, 13, 14, 36, 37, 38, 1024, 1025, 1026, 1031)
#: ``MAP_SHARED`` (``MAP_SHARED_VALIDATE`` has it too) and ``MAP_ANONYMOUS`` (linux/mman.h): mmap with the
#: first and without the second (a shared mapping of a file) is refused
MAP_SHARED = 0x01
MAP_ANONYMOUS = 0x20
#: ``prctl`` option refused (linux/prctl.h): clearing or changing the parent-death signal would let a worker
#: outlive the process that watches it (coevo.sandbox.zygote has its own copy: it is a standard-library-only script)
PR_SET_PDEATHSIG = 1
#: socket families a heuristic may create (AF_UNIX, AF_INET, AF_INET6; its network namespace has only
#: loopback): every other family (AF_VSOCK, AF_PACKET, AF_NETLINK, AF_ALG, ...) is refused
SOCKET_FAMILIES = (1, 2, 10)

#: the refused calls (see the module docstring), by name
DENIED = (
    "keyctl",
    "add_key",
    "request_key",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "quotactl",
    "quotactl_fd",
    "name_to_handle_at",
    "open_by_handle_at",
    "syslog",
    "vhangup",
    "lookup_dcookie",
    # the page cache as a store (issue 45): set / clear whether a page of a shared file is cached, or read it
    "fadvise64",
    "readahead",
    "mincore",
    "process_madvise",
    "cachestat",
    # issue 54: kernel objects reached through shared files, and host-wide tables
    "io_setup",
    "io_destroy",
    "io_submit",
    "io_cancel",
    "io_getevents",
    "io_pgetevents",
    "inotify_init1",
    "inotify_add_watch",
    "inotify_rm_watch",
    "fanotify_init",
    "fanotify_mark",
    "flock",
    "sysinfo",
    "sync",
    "syncfs",
)

#: per machine: (AUDIT_ARCH_* value, first number of a foreign ABI sharing the arch value or None, numbers)
_X86_64 = {
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "unshare": 272,
    "setns": 308,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "bpf": 321,
    "perf_event_open": 298,
    "userfaultfd": 323,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "reboot": 169,
    "swapon": 167,
    "swapoff": 168,
    "acct": 163,
    "settimeofday": 164,
    "clock_settime": 227,
    "clock_adjtime": 305,
    "adjtimex": 159,
    "sethostname": 170,
    "setdomainname": 171,
    "quotactl": 179,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "syslog": 103,
    "vhangup": 153,
    "lookup_dcookie": 212,
    "clone": 56,
    "fadvise64": 221,
    "readahead": 187,
    "mincore": 27,
    "preadv2": 327,
    "pwritev2": 328,
    "madvise": 28,
    "socket": 41,
    "socketpair": 53,
    "iopl": 172,
    "ioperm": 173,
    "uselib": 134,
    "io_setup": 206,
    "io_destroy": 207,
    "io_getevents": 208,
    "io_submit": 209,
    "io_cancel": 210,
    "io_pgetevents": 333,
    "inotify_init": 253,
    "inotify_init1": 294,
    "inotify_add_watch": 254,
    "inotify_rm_watch": 255,
    "fanotify_init": 300,
    "fanotify_mark": 301,
    "flock": 73,
    "fcntl": 72,
    "sysinfo": 99,
    "sync": 162,
    "syncfs": 306,
    "mmap": 9,
    "prctl": 157,
}
_AARCH64 = {
    "keyctl": 219,
    "add_key": 217,
    "request_key": 218,
    "unshare": 97,
    "setns": 268,
    "mount": 40,
    "umount2": 39,
    "pivot_root": 41,
    "chroot": 51,
    "ptrace": 117,
    "process_vm_readv": 270,
    "process_vm_writev": 271,
    "bpf": 280,
    "perf_event_open": 241,
    "userfaultfd": 282,
    "kexec_load": 104,
    "kexec_file_load": 294,
    "init_module": 105,
    "finit_module": 273,
    "delete_module": 106,
    "reboot": 142,
    "swapon": 224,
    "swapoff": 225,
    "acct": 89,
    "settimeofday": 170,
    "clock_settime": 112,
    "clock_adjtime": 266,
    "adjtimex": 171,
    "sethostname": 161,
    "setdomainname": 162,
    "quotactl": 60,
    "name_to_handle_at": 264,
    "open_by_handle_at": 265,
    "syslog": 116,
    "vhangup": 58,
    "lookup_dcookie": 18,
    "clone": 220,
    "fadvise64": 223,
    "readahead": 213,
    "mincore": 232,
    "preadv2": 286,
    "pwritev2": 287,
    "madvise": 233,
    "socket": 198,
    "socketpair": 199,
    "io_setup": 0,
    "io_destroy": 1,
    "io_submit": 2,
    "io_cancel": 3,
    "io_getevents": 4,
    "io_pgetevents": 292,
    "inotify_init1": 26,
    "inotify_add_watch": 27,
    "inotify_rm_watch": 28,
    "fanotify_init": 262,
    "fanotify_mark": 263,
    "flock": 32,
    "fcntl": 25,
    "sysinfo": 179,
    "sync": 81,
    "syncfs": 267,
    "mmap": 222,
    "prctl": 167,
}
_COMMON = {  # numbers shared by both tables (the unified numbering of newer calls)
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "pidfd_getfd": 438,
    "process_madvise": 440,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "cachestat": 451,
}
#: machine -> (AUDIT_ARCH value, numbers at or above this are another ABI (x32) or None, syscall table)
ARCHES = {
    "x86_64": (0xC000003E, 0x40000000, {**_X86_64, **_COMMON}),
    "aarch64": (0xC00000B7, None, {**_AARCH64, **_COMMON}),
}
#: refused on x86_64 only (no such call elsewhere)
_X86_ONLY = ("iopl", "ioperm", "uselib", "inotify_init")


def supported(machine: str | None = None) -> bool:
    """Whether a filter can be built for ``machine`` (default: this one, ``platform.machine()``)."""
    return (machine or platform.machine()) in ARCHES


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def denied_numbers(machine: str | None = None) -> dict[str, int]:
    """The refused calls of ``machine`` by name -> number (``clone`` and ``clone3`` excluded).

    Raises:
        ValueError: no table for this machine (:func:`supported` is False).
    """
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise ValueError(f"no seccomp table for machine {machine!r} (known: {sorted(ARCHES)})")
    table = ARCHES[machine][2]
    names = [*DENIED, *(_X86_ONLY if machine == "x86_64" else ())]
    return {n: table[n] for n in names}


def build_filter(machine: str | None = None) -> bytes:
    """The filter program for ``machine`` (default: this one) as bubblewrap's ``--seccomp`` reads it: an
    array of ``struct sock_filter`` (8 bytes each, native little-endian), no header.

    Raises:
        ValueError: no table for this machine.
    """
    machine = machine or platform.machine()
    deny = sorted(set(denied_numbers(machine).values()))
    arch, foreign_from, table = ARCHES[machine]
    body: list[tuple] = []  # (code, k, jt label or offset, jf label or offset); labels jump forward only
    body.append((_LD_W_ABS, _ARCH, 0, 0))
    body.append((_JEQ_K, arch, 1, 0))
    body.append((_RET_K, RET_KILL_PROCESS, 0, 0))
    body.append((_LD_W_ABS, _NR, 0, 0))
    if foreign_from is not None:
        body.append((_JGE_K, foreign_from, "kill", 0))
    for nr in deny:
        body.append((_JEQ_K, nr, "eperm", 0))
    body.append((_JEQ_K, table["clone3"], "enosys", 0))
    checked = [("clone", "clone"), ("preadv2", "rwf"), ("pwritev2", "rwf"), ("madvise", "madvise")]
    checked += [
        ("socket", "socket"),
        ("socketpair", "socket"),
        ("fcntl", "fcntl"),
        ("mmap", "mmap"),
        ("prctl", "prctl"),
    ]
    for name, label in checked:
        body.append((_JEQ_K, table[name], label, 0))
    blocks = {  # label -> instructions testing the call's arguments (low 32 bits, little-endian)
        "clone": [(_LD_W_ABS, _ARG0, 0, 0), (_JSET_K, CLONE_NEW_FLAGS, "eperm", "allow")],
        "rwf": [(_LD_W_ABS, _ARG0 + 8 * 5, 0, 0), (_JSET_K, RWF_NOWAIT, "eperm", "allow")],
        "madvise": [(_LD_W_ABS, _ARG0 + 8 * 2, 0, 0)]
        + [(_JEQ_K, advice, "eperm", 0) for advice in MADV_DENIED]
        + [(_RET_K, RET_ALLOW, 0, 0)],
        "socket": [(_LD_W_ABS, _ARG0, 0, 0)]
        + [(_JEQ_K, family, "allow", 0) for family in SOCKET_FAMILIES]
        + [(_RET_K, RET_ERRNO | errno.EPERM, 0, 0)],
        "fcntl": [(_LD_W_ABS, _ARG0 + 8, 0, 0)]
        + [(_JEQ_K, cmd, "eperm", 0) for cmd in FCNTL_DENIED]
        + [(_RET_K, RET_ALLOW, 0, 0)],
        "prctl": [(_LD_W_ABS, _ARG0, 0, 0), (_JEQ_K, PR_SET_PDEATHSIG, "eperm", "allow")],
        "mmap": [
            (_LD_W_ABS, _ARG0 + 8 * 3, 0, 0),
            (_JSET_K, MAP_ANONYMOUS, "allow", 0),
            (_JSET_K, MAP_SHARED, "eperm", "allow"),
        ],
    }
    labels: dict[str, int] = {}
    body.append((_RET_K, RET_ALLOW, 0, 0))  # any other call
    for label, block in blocks.items():
        labels[label] = len(body)
        body.extend(block)
    for label, action in (
        ("allow", RET_ALLOW),
        ("eperm", RET_ERRNO | errno.EPERM),
        ("enosys", RET_ERRNO | errno.ENOSYS),
    ):
        labels[label] = len(body)
        body.append((_RET_K, action, 0, 0))
    labels["kill"] = len(body)
    body.append((_RET_K, RET_KILL_PROCESS, 0, 0))
    out = []
    for i, (code, k, jt, jf) in enumerate(body):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        if not (0 <= jt <= 255 and 0 <= jf <= 255):
            raise ValueError("seccomp program too long for 8-bit jumps")
        out.append(_ins(code, k, jt, jf))
    return b"".join(out)


def filter_fd(program: bytes) -> int:
    """A readable file descriptor holding ``program`` (a pipe whose write end is already closed), to be
    passed to bubblewrap as ``--seccomp FD``; the caller closes it once the child has started.

    Raises:
        OSError: no pipe could be made, or the program does not fit into the pipe's buffer.
    """
    read_fd, write_fd = os.pipe()
    try:
        if os.write(write_fd, program) != len(program):
            raise OSError("seccomp program did not fit into a pipe")
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return read_fd
