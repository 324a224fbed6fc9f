"""`python -m memledger ARGS` and the wheel's `memledger` console script:
run the memledger command line that came with this package."""

import os
import sys

from memledger._command import command_path


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    exe = command_path()
    if exe is None:
        sys.stderr.write("memledger: the memledger command line is not installed with this Python package "
                         "(%s); install the package with pip, or build the project with meson\n"
                         % os.path.dirname(os.path.abspath(__file__)))
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, ["memledger"] + args)


if __name__ == "__main__":
    sys.exit(main())
