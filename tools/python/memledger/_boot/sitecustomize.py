"""Loaded by Python's `site` at start-up in every Python process that
`memledger run` traces: this folder comes first on PYTHONPATH.

It starts memledger's Python helpers (memledger._autoload), then runs the
sitecustomize that this one hides, if there is one (Debian ships one in
/etc/python3.X), exactly as `site` would have run it."""


def _start():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("MEMLEDGER_DIR") and os.environ.get("MEMLEDGER_PYTHON_HOOKS", "1") != "0":
        try:
            import memledger._autoload
        except Exception:  # never let the helpers stop the program
            pass
    import importlib.machinery
    import importlib.util

    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_start()
del _start
