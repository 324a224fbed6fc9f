"""Where the memledger command line is, seen from this package: inside it
(_native/, the pip-installed package), beside it in a meson build tree
(tools/python/memledger -> tools/memledger), or in the prefix it was
installed into (share/memledger/python/memledger -> bin/memledger). Never
looked up on PATH: that would find the console script that calls us."""

import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_CANDIDATES = (
    os.path.join(_HERE, "_native", "memledger"),
    os.path.join(_HERE, os.pardir, os.pardir, "memledger"),
    os.path.join(_HERE, os.pardir, os.pardir, os.pardir, os.pardir, "bin", "memledger"),
)


def command_path():
    """The memledger executable, or None when this package has none."""
    for path in _CANDIDATES:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.realpath(path)
    return None
