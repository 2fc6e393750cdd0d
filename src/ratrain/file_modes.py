"""Files written by a library that makes them private: given the mode any file this process
creates has (0o666 less the umask). safetensors 0.8's save_file makes its files 0600, so a
run's checkpoint weights and an export's model.safetensors were the owner's alone where
every other file of the run was readable by the group (until 2026-12-04)."""

from __future__ import annotations

import os
from pathlib import Path

_UMASK = os.umask(0)
os.umask(_UMASK)  # read once, at import (the main thread): os.umask sets as it reads


def with_usual_mode(path: str | Path) -> None:
    """Give `path` the mode a file created here by open() would have."""
    os.chmod(path, 0o666 & ~_UMASK)
