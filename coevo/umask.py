"""File modes that follow the user's umask.

Some writers create files with mode 0600 whatever the umask: ``safetensors.torch.save_file`` writes
through a private temporary file, and ``tempfile.mkdtemp`` makes 0700 folders. Model folders in the cache
and exported weights are meant to be shared like any other file the user writes, so after writing them
:func:`honour_umask` sets the modes an ordinary ``open`` / ``mkdir`` would have given: ``0666 & ~umask``
for files, ``0777 & ~umask`` for folders (executable bits of files are kept).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def current_umask() -> int:
    """The process's umask (e.g. 0o022), read without changing it (``/proc`` when available)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)  # no /proc: the classic read-by-setting (not thread-safe, but brief)
    os.umask(old)
    return old


def honour_umask(path: str | Path) -> None:
    """Give ``path`` (a file, or a folder and everything under it) the modes the umask implies.

    Links are not followed. Raises OSError when a mode cannot be changed (e.g. a file of another user).
    """
    mask = current_umask()
    path = Path(path)
    todo = [path, *path.rglob("*")] if path.is_dir() and not path.is_symlink() else [path]
    for p in todo:
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        if stat.S_ISDIR(st.st_mode):
            mode = 0o777 & ~mask
        else:
            mode = (0o777 if st.st_mode & 0o111 else 0o666) & ~mask
        if stat.S_IMODE(st.st_mode) != mode:
            os.chmod(p, mode)
