"""Prints the line-table cases of tests/unit/python_frames_test.cpp for the
running interpreter: a function with loops, a comprehension, an exception
handler, a jump of 200 lines and a multi-line return, its code object's
first line, line-table format (trace_format.h LineTableFormat), line table,
and the line of every instruction as the interpreter itself maps it
(co_lines() from 3.10, dis.findlinestarts() for 3.9's co_lnotab).

    for v in 3.9 3.10 3.11 3.12 3.13; do python$v tests/unit/python_line_cases.py; done \\
        > tests/unit/python_line_cases.inc
"""
import sys, dis
SRC = '''
def sample(n):
    total = 0
    for i in range(n):
        if i % 3 == 0:
            total += i
        else:
            total -= 1
    values = [
        i * 2
        for i in range(n)
    ]
    try:
        x = 1 / (n - n)
    except ZeroDivisionError:
        x = None
''' + "\n" * 200 + '''    far = total + 1
''' + "".join("    total = total + %d\n" % k for k in range(12)) + '''    return (total,
            values,
            far,
            x)
'''
ns = {}
exec(compile(SRC, "sample.py", "exec"), ns)
co = ns["sample"].__code__
v = sys.version_info
if v >= (3, 10):
    table = co.co_linetable
    fmt = 2 if v < (3, 11) else 3
    expected = {}
    for start, end, line in co.co_lines():
        for off in range(start, end, 2):
            expected[off] = line or 0
else:
    table = co.co_lnotab
    fmt = 1
    starts = list(dis.findlinestarts(co))
    expected = {}
    for off in range(0, len(co.co_code), 2):
        line = co.co_firstlineno
        for s, l in starts:
            if s <= off:
                line = l
        expected[off] = line
pairs = sorted(expected.items())
print("  {\"%d.%d\", %d, %d, std::string(\"%s\", %d),\n   {%s}}," % (v[0], v[1], co.co_firstlineno, fmt,
      "".join("\\x%02x" % b for b in table), len(table),
      ", ".join("{%d, %d}" % p for p in pairs)))
