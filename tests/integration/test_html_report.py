"""The HTML report opened in a real headless Chromium (Debian's `chromium`):
no console errors, no blocked loads, the charts, tables and flame graphs
present and of a readable size, and drawn (checked on screenshots); a run
whose symbol, file and step names are HTML and script renders them as
inert text.

Skips, with a message, when Chromium is not installed (scripts/install-deps.sh
installs it). The README's screenshots come from this test:

    MLTEST_UPDATE_DOCS=1 meson test -C build test_html_report
"""

import base64
import os
import shutil
import subprocess
import sys
import unittest

import headless_chromium
import mltest

CHROMIUM = headless_chromium.find_chromium()
DOCS_DIR = mltest.SOURCE_DIR / "docs"
UPDATE_DOCS = os.environ.get("MLTEST_UPDATE_DOCS") == "1"

STEPS = 30

# Strings a traced program controls: its command line, step labels, function
# names (ELF symbols) and source paths (DWARF).
HOSTILE_FUNCTION = "<script>document.title='PWNED'</script><img src=x onerror=\"document.title='PWNED2'\">"
HOSTILE_LABEL = "\"><img src=x onerror=alert(1)><b>bold</b>"
HOSTILE_DIR = "<script>alert(1)</script>"  # two folders: "<script>alert(1)<" and "script>"

HOSTILE_MAIN = r"""
#include <dlfcn.h>
#include <stddef.h>
void hostile_alloc(size_t n);
int main(int argc, char** argv) {
  void (*step)(const char*) = (void (*)(const char*))dlsym(RTLD_DEFAULT, "memledger_step");
  for (int i = 0; i < 8; ++i) {
    hostile_alloc(4096);
    if (step) step(argc > 1 ? argv[1] : "");
  }
  return 0;
}
"""

# Built without debug info, so the report names the function by its ELF
# symbol, which objcopy then renames.
HOSTILE_ALLOC = r"""
#include <stdlib.h>
#include <string.h>
void* volatile hostile_sink;
__attribute__((noinline)) void hostile_alloc(size_t n) {
  void* p = malloc(n);
  memset(p, 1, n);
  hostile_sink = p;
}
"""

# Pixel statistics of a PNG, computed by the browser itself on a canvas: the
# share of pixels that are not the background, and whether a given color
# (a chart's line) is there.
PNG_STATS = """
new Promise((resolve, reject) => {
  const img = new Image();
  img.onload = () => {
    const c = document.createElement('canvas');
    c.width = img.width; c.height = img.height;
    const g = c.getContext('2d');
    g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, img.width, img.height).data;
    const bg = [d[0], d[1], d[2]];
    const want = %s;
    let ink = 0, hits = 0;
    for (let i = 0; i < d.length; i += 4) {
      if (Math.abs(d[i] - bg[0]) + Math.abs(d[i + 1] - bg[1]) + Math.abs(d[i + 2] - bg[2]) > 30) ink++;
      if (want && Math.abs(d[i] - want[0]) + Math.abs(d[i + 1] - want[1]) + Math.abs(d[i + 2] - want[2]) < 40) hits++;
    }
    resolve({width: img.width, height: img.height, ink: ink / (d.length / 4), color_pixels: hits});
  };
  img.onerror = () => reject(new Error('not a PNG'));
  img.src = 'data:image/png;base64,%s';
})
"""

# What the page holds, measured in the browser.
MEASURE = """
(() => {
  const box = e => { const r = e.getBoundingClientRect();
                     return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height}; };
  const fig = sel => [...document.querySelectorAll(sel)].map(e => Object.assign(box(e),
      {title: (e.closest('figure') || e).querySelector('figcaption b')?.textContent || ''}));
  return {
    title: document.title,
    charts: fig('svg.chart-svg'),
    flames: fig('svg.flame-svg'),
    flame_text: [...document.querySelectorAll('figure.flame')].map(f => f.textContent),
    tables: [...document.querySelectorAll('table')].map(t => Object.assign(box(t), {rows: t.tBodies[0].rows.length,
        head: [...t.tHead.rows[0].cells].map(c => c.textContent)})),
    sparklines: document.querySelectorAll('svg.spark').length,
    scripts: document.querySelectorAll('script').length,
    images: document.querySelectorAll('img, iframe, object, embed').length,
    handlers: [...document.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name))
                .filter(n => n.startsWith('on')),
    text: document.body.textContent,
    verdict: document.querySelector('.verdict').textContent,
  };
})()
"""


@unittest.skipIf(CHROMIUM is None, "SKIP: chromium is not installed (apt-get install chromium; scripts/install-deps.sh)")
class HtmlInChromium(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        tmp = cls.class_tmpdir()
        # Run as ./leak_steps from a folder of its own: the pages (and the
        # README's screenshots) show a short command line.
        os.symlink(mltest.program("leak_steps"), os.path.join(tmp, "leak_steps"))
        cls.single = os.path.join(tmp, "single")
        proc = cls.traced(cls.single, ["./leak_steps", str(STEPS), "65536"], cwd=tmp)
        assert proc.returncode == 0, cls.describe(proc)
        cls.ranks = os.path.join(tmp, "ranks")
        script = " ".join("RANK=%d WORLD_SIZE=3 ./leak_steps %d %d &" % (i, STEPS, leak)
                          for i, leak in enumerate([0, 16384, 0])) + " wait"
        proc = cls.traced(cls.ranks, ["/bin/sh", "-c", script], cwd=tmp)
        assert proc.returncode == 0, cls.describe(proc)
        cls.browser = headless_chromium.Chromium(CHROMIUM, width=1280, height=1000)
        cls.addClassCleanup(cls.browser.close)
        cls.browser.open_page()

    def open(self, run_dir):
        self.browser.navigate("file://" + os.path.join(run_dir, "report.html"))
        page = self.browser.evaluate(MEASURE)
        self.assertEqual(self.browser.problems(), [], "console errors or blocked loads")
        return page

    def png_stats(self, png, color=None):
        return self.browser.evaluate(PNG_STATS % (color or "null", base64.b64encode(png).decode()))

    def save_doc(self, name, png):
        if UPDATE_DOCS:
            DOCS_DIR.mkdir(exist_ok=True)
            (DOCS_DIR / name).write_bytes(png)
            print("test_html_report: wrote %s" % (DOCS_DIR / name), file=sys.stderr)

    def test_single_process_page(self):
        page = self.open(self.single)
        self.assertEqual(page["title"], "memledger: leak_steps")
        self.assertIn("clean exit (code 0)", page["verdict"])
        self.assertEqual([c["title"] for c in page["charts"]],
                         ["Live and held bytes per step", "Fragmentation per step", "Host RSS against the limit"])
        for chart in page["charts"]:
            self.assertGreaterEqual(chart["width"], 900, chart)
            self.assertGreaterEqual(chart["height"], 200, chart)
        # What grew first, from the end of the warm-up: the planted leak, and
        # none of the start-up (the loader's and stdio's buffers).
        self.assertRegex(page["flames"][0]["title"], r"^Bytes gained between the end of step \d+ and the end of "
                                                     r"step %d by the sites that grew$" % STEPS)
        self.assertIn("plant_leak", page["flame_text"][0])
        self.assertNotIn("call_init", page["flame_text"][0])
        self.assertEqual([f["title"] for f in page["flames"][1:]], ["Live bytes at the peak (in step %d)" % STEPS,
                                                                     "Live bytes at the end"])
        for flame in page["flames"]:
            self.assertGreaterEqual(flame["width"], 900, flame)
            self.assertGreaterEqual(flame["height"], 5 * 17, flame)  # at least main -> plant_leak deep
        heads = [t["head"][:3] for t in page["tables"]]
        self.assertIn(["#", "site", "bytes/step"], heads)
        suspects = page["tables"][heads.index(["#", "site", "bytes/step"])]
        self.assertEqual(suspects["rows"], 1)
        self.assertEqual(page["sparklines"], 1)
        self.assertIn("plant_leak(unsigned long, unsigned long) at leak_steps.cpp:", page["text"])
        self.assertIn("step (source: marker)", page["text"])
        self.assertEqual((page["scripts"], page["images"], page["handlers"]), (0, 0, []))

        # The charts are drawn: ink in every chart, the host live line's blue in
        # the first, the flame graphs filled.
        for i, chart in enumerate(page["charts"]):
            stats = self.png_stats(self.browser.screenshot(chart), "[41, 98, 168]" if i < 2 else None)
            self.assertEqual((stats["width"], stats["height"]), (round(chart["width"]), round(chart["height"])))
            self.assertGreater(stats["ink"], 0.01, chart["title"])
            if i < 2:
                self.assertGreater(stats["color_pixels"], 200, chart["title"])
        for flame in page["flames"]:
            self.assertGreater(self.png_stats(self.browser.screenshot(flame))["ink"], 0.15, flame["title"])

        full = self.browser.screenshot("page")
        stats = self.png_stats(full)
        self.assertEqual(stats["width"], 1280)
        self.assertGreater(stats["height"], 2000)
        self.save_doc("html-report.png", full)

    def test_report_command_writes_the_same_page(self):
        out = os.path.join(self.tmpdir(), "r.html")
        proc = self.memledger("report", self.single, "--format", "html", "-o", out)
        self.assertExit(proc, 0)
        with open(out) as a, open(os.path.join(self.single, "report.html")) as b:
            self.assertEqual(a.read(), b.read())

    def test_whole_job_page(self):
        page = self.open(self.ranks)
        self.assertIn("Whole job: 7 processes", page["text"])
        job = [t for t in page["tables"] if t["head"][:2] == ["process", "role"]]
        self.assertEqual(len(job), 1)
        self.assertEqual(job[0]["rows"], 7)
        self.assertRegex(page["text"], r"rank 1 \(pid \d+\) grows fastest: 16\.0 KiB/step")
        # One set of charts per process with steps (the three ranks); the
        # launcher's shell and the pre-exec images have none.
        self.assertEqual(len(page["charts"]), 3 * 3)
        self.assertEqual(page["text"].count("No steps were recorded"), 4)
        top = self.browser.screenshot({"x": 0, "y": 0, "width": 1280, "height": job[0]["y"] + job[0]["height"] + 24})
        self.assertGreater(self.png_stats(top)["ink"], 0.02)
        self.save_doc("html-report-job.png", top)

    def build_hostile(self):
        cc = shutil.which("cc") or shutil.which("gcc")
        objcopy = shutil.which("objcopy")
        if cc is None or objcopy is None:
            self.skipTest("SKIP: needs a C compiler and objcopy to build the hostile program")
        src_dir = os.path.join(self.tmpdir(), HOSTILE_DIR)
        os.makedirs(src_dir)
        main_c = os.path.join(src_dir, "hostile_main.c")
        alloc_c = os.path.join(src_dir, "hostile_alloc.c")
        with open(main_c, "w") as f:
            f.write(HOSTILE_MAIN)
        with open(alloc_c, "w") as f:
            f.write(HOSTILE_ALLOC)
        exe = os.path.join(os.path.dirname(src_dir), "hostile")
        subprocess.run([cc, "-O1", "-fno-omit-frame-pointer", "-c", "-o", alloc_c + ".o", alloc_c], check=True)
        subprocess.run([cc, "-g", "-O0", "-fno-omit-frame-pointer", "-o", exe, main_c, alloc_c + ".o", "-ldl"],
                       check=True)
        subprocess.run([objcopy, "--redefine-sym", "hostile_alloc=" + HOSTILE_FUNCTION, exe], check=True)
        return exe, main_c

    def test_hostile_strings_render_inert(self):
        exe, main_c = self.build_hostile()
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, [exe, HOSTILE_LABEL])
        self.assertExit(proc, 0)
        report = self.load_report(run_dir)
        suspect = report["leak_suspects"][0]
        self.assertEqual(suspect["site"].split(" in ")[0], HOSTILE_FUNCTION, "the renamed symbol names the site")
        self.assertIn(main_c, [f["file"] for f in suspect["stack"]])
        self.assertEqual(report["steps"][0]["label"], HOSTILE_LABEL)

        page = self.open(run_dir)
        # Nothing ran, nothing was injected: the title is ours, the page has no
        # script, image or event handler, and the strings read as text.
        self.assertEqual(page["title"], "memledger: hostile")
        self.assertEqual((page["scripts"], page["images"], page["handlers"]), (0, 0, []))
        self.assertIn(HOSTILE_FUNCTION, page["text"])
        self.assertIn(main_c, page["text"])
        self.assertIn("step 1 (%s)" % HOSTILE_LABEL, page["text"])
        self.assertIn(HOSTILE_LABEL, page["text"])


if __name__ == "__main__":
    mltest.main()
