"""Loaded by Python's `site` at start-up in every Python process that
`memledger run` traces: this folder comes first on PYTHONPATH.

It starts memledger's Python helpers (memledger._autoload) where the
interpreter is one they support (Python 3.9 on), then runs the
sitecustomize that this one hides, if there is one (Debian ships one in
/etc/python3.X), exactly as `site` would have run it. Written for every
Python that may be traced, Python 2 included: an old script run by a traced
job must go on as it would have."""


def _start():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    if (sys.version_info >= (3, 9) and os.environ.get("MEMLEDGER_DIR")
            and os.environ.get("MEMLEDGER_PYTHON_HOOKS", "1") != "0"):
        try:
            import memledger._autoload
        except Exception:  # never let the helpers stop the program
            pass
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import importlib.machinery
        import importlib.util
    except ImportError:  # Python 2: the hidden one through imp
        import imp

        try:
            found = imp.find_module("sitecustomize", path)
        except ImportError:
            return
        try:
            imp.load_module("sitecustomize", *found)
        finally:
            if found[0] is not None:
                found[0].close()
        return
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_start()
del _start
