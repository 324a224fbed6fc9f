"""Takes stacks from real runs' JSON reports into a golden file of the role
table's unit test (tests/unit/roles_test.cpp).

    python3 tests/data/roles/extract.py OUT.json RUN_DIR...

Each run folder's report.json (each of its processes, for a job of
several) gives the largest sites of each role at the
last step end (roles.top_sites, with when they allocated), its growth
suspects and exit-leak sites (made in the steps and kept: phase "steps")
and its start-up allocations (phase "startup"), with their full stacks and
the role the report gave them. At most three stacks per role and run are kept, each with the frames
the rules read (Python: qualified name, file, attributed; native: function
and library). Review the roles before committing the file: they are what
the test then expects.
"""
import json
import os
import sys


def frames(stack):
    out = []
    for f in stack:
        if f["language"] == "python":
            out.append({"python": True, "function": f["function"], "file": f["file"],
                        "attributed": f.get("attributed", False)})
        else:
            out.append({"function": f["function"], "module": os.path.basename(f["module"])})
    return out


def sites(report):
    for role, top in report["roles"]["top_sites"].items():
        for s in top:
            yield s["phase"], dict(s, role=role)
    for s in report["leak_suspects"]:
        yield "steps", s
    for s in report["exit_leaks"]["sites"]:
        yield "steps", s
    for s in report["startup_allocations"]["sites"]:
        yield "startup", s


def main():
    out, runs = sys.argv[1], sys.argv[2:]
    stacks = []
    for run in runs:
        with open(os.path.join(run, "report.json")) as f:
            report = json.load(f)
        per_role = {}
        seen = set()
        # A job of several processes (DataLoader workers, ranks): each one's own sites.
        processes = [p for p in report.get("processes", []) if "roles" in p] or [report]
        for phase, s in (site for p in processes for site in sites(p)):
            if "role" not in s or not s["stack"] or (s["site"], s["role"]) in seen:
                continue
            seen.add((s["site"], s["role"]))
            key = (s["role"], phase)
            if per_role.get(key, 0) >= 3:
                continue
            per_role[key] = per_role.get(key, 0) + 1
            stacks.append({"site": s["site"], "role": s["role"], "phase": phase, "kept": True, "kind": s["kind"],
                           "frames": frames(s["stack"])})
    with open(out, "w") as f:
        json.dump(stacks, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
