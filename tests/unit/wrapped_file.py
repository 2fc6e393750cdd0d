"""A real file standing in for open()'s, whose `write` a test overrides: a disk that fills, a
Ctrl-C that lands in a write (patched in as checkpoint/store.py's `open`)."""

from __future__ import annotations


class WrappedFile:
    def __init__(self, f):
        self.f = f

    def write(self, data):
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()
