"""Roles on the real framework clients (tests/clients), traced by plain
`memledger run -- CMD` (sampled host mode, steps marked by the memledger
Python module): the planted suspect has the right role and, where the role
makes the cause plain, its explanation; the clean controls' roles add up to
the live bytes at every step end and none of them grows; `memledger check`
and `diff` judge by role; a policy file's [roles] rules come first.

    PyTorch: a validation loss kept as a tensor with its graph (activation);
             a new optimizer every step, the old ones kept (optimizer_state).
    Keras:   a model.fit callback that keeps the model's logits (activation).
    JAX:     every step's jitted output kept in a dict (activation).
"""

import base64
import json
import os

import clients
import headless_chromium
import mltest

STEPS = 20
ACTIVATION_WHY = ("activations from forward stay alive after their step: a tensor that keeps its autograd graph is "
                  "being kept; keep loss.item() or .detach() instead")
OPTIMIZER_WHY = "optimizer state grows: a new parameter group or optimizer each step?"


class Roles(clients.ClientTestCase):
    runs = {}

    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_tmpdir()

    def client(self, framework, leak, *options):
        clients.skip_unless(self, framework)
        markers = "callback" if framework == "tensorflow" else "step"
        key = (framework, leak) + options
        if key not in self.runs:
            run_dir = os.path.join(self.tmp, "-".join(k.strip("-") for k in key))
            self.runs[key] = clients.run_client(self, framework, run_dir, "--steps", STEPS, "--leak", leak,
                                                "--markers", markers, options=options)
            self.runs[key].run_dir = run_dir
        run = self.runs[key]
        self.assertCompleted(run)
        self.assertEqual(len(run.report["steps"]), STEPS)
        return run

    def check_role(self, framework, leak, role, why=None, low=0.75):
        run = self.client(framework, leak)
        top = self.assertTopSuspectIsTheLeak(run, low=low)
        if framework == "jax":
            # XLA makes the outputs on its own threads: the line is the main
            # thread's at that moment, one of the loop's (attributed).
            self.assertAttributedToTheLoop(top, run)
        else:
            self.assertNamesPlantedLine(top, run)
        self.assertEqual(top["role"], role, "%s: %s" % (top["site"], top.get("role_rule")))
        if why is not None:
            self.assertEqual(top["role_explanation"], why)
        self.assertIn(role, [g["role"] for g in run.report["roles"]["growing"]], run.report["roles"])
        with open(os.path.join(run.run_dir, "report.txt")) as f:
            text = f.read()
        self.assertIn("     role: %s (" % role, text)
        self.assertIn("roles growing after the warm-up: %s" % role, text)
        if why is not None:
            self.assertIn("     why: " + why, text)
        return run

    def check_clean(self, framework, *options):
        run = self.client(framework, "none", *options)
        self.assertEqual([s["site"] for s in run.report["leak_suspects"]], [])
        self.assertEqual(run.report["roles"]["growing"], [])
        for step in run.report["steps"]:
            live = sum(step["live"].values())
            self.assertEqual(sum(step["roles"].values()), live, "step %d: %s" % (step["index"], step["roles"]))
            self.assertTrue(all(v >= 0 for v in step["roles"].values()), step["roles"])
        # The peak by role adds up to the peak (sampled host mode: the host
        # heap's, split by the sampled shares).
        at_peak = run.report["roles"]["at_peak"]
        self.assertEqual(sum(at_peak.values()), run.report["peak"]["bytes"], at_peak)
        self.assertTrue(all(v >= 0 for v in at_peak.values()), at_peak)
        return run

    # PyTorch
    def test_torch_loss_kept_with_its_graph_is_activation(self):
        self.check_role("torch", "loss", "activation", ACTIVATION_WHY)

    def test_torch_new_optimizer_every_step_is_optimizer_state(self):
        self.check_role("torch", "optimizer", "optimizer_state", OPTIMIZER_WHY)

    def test_torch_clean_control(self):
        run = self.check_clean("torch")
        last = run.report["steps"][-1]["roles"]
        # The model's parameters (2.2 MB), their gradients and SGD's momentum
        # buffers are live at every step end, each under its own role.
        parameters = 4 * (64 * 512 + 512 + 512 * 1000 + 1000)
        for role in ("parameter", "gradient", "optimizer_state"):
            self.assertGreaterEqual(last[role], parameters // 2, (role, last))

    def test_torch_clean_control_full_mode(self):
        # Every allocation recorded: the roles add up without any estimate.
        run = self.check_clean("torch", "--host", "full")
        self.assertFalse(run.report["roles"]["estimated"])
        # The peak by role: every live byte of the peak has a role, the
        # forward pass's activations (freed within their step) among them.
        at_peak = run.report["roles"]["at_peak"]
        for role in ("parameter", "gradient", "activation"):
            self.assertGreater(at_peak[role], 0, at_peak)
        with open(os.path.join(run.run_dir, "report.txt")) as f:
            text = f.read()
        self.assertRegex(text, r"\nat the peak \([\d.]+ [KMG]iB, in step \d+\): .*activation [\d.]+ [KMG]iB \(\d+%\)")

    # Keras
    def test_keras_callback_keeping_logits_is_activation(self):
        run = self.check_role("tensorflow", "callback", "activation")
        self.assertIn("outputs of the model stay alive after their step", run.report["leak_suspects"][0]["role_explanation"])

    def test_keras_clean_control(self):
        self.check_clean("tensorflow")

    # JAX
    def test_jax_outputs_kept_in_a_dict_are_activation(self):
        run = self.check_role("jax", "dict", "activation")
        self.assertIn("outputs of the jitted step stay alive", run.report["leak_suspects"][0]["role_explanation"])

    def test_jax_clean_control(self):
        self.check_clean("jax")

    def test_html_stacked_roles(self):
        chromium = headless_chromium.find_chromium()
        if chromium is None:
            self.skipTest("SKIP: chromium is not installed (apt-get install chromium; scripts/install-deps.sh)")
        run = self.client("torch", "loss")
        browser = headless_chromium.Chromium(chromium, width=1280, height=1000)
        self.addCleanup(browser.close)
        browser.open_page()
        browser.navigate("file://" + os.path.join(run.run_dir, "report.html"))
        page = browser.evaluate("""(() => {
          const fig = document.querySelector('figure.roles');
          if (!fig) return null;
          const r = fig.querySelector('svg').getBoundingClientRect();
          return {title: fig.querySelector('figcaption b').textContent,
                  keys: [...fig.querySelectorAll('.key')].map(k => k.textContent),
                  areas: [...fig.querySelectorAll('polygon.area')].map(a => a.dataset.role),
                  hovers: fig.querySelectorAll('rect.hover').length,
                  note: fig.querySelector('.note').textContent,
                  box: {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height},
                  why: [...document.querySelectorAll('.why')].map(e => e.textContent)};
        })()""")
        self.assertEqual(browser.problems(), [], "console errors or blocked loads")
        self.assertIsNotNone(page, "no role chart")
        self.assertEqual(page["title"], "Live bytes by role per step")
        for role in ("parameter", "gradient", "optimizer_state", "activation"):
            self.assertIn(role, page["keys"])
            self.assertIn(role, page["areas"])
        self.assertEqual(page["hovers"], STEPS)
        self.assertIn("Growing after the warm-up: activation", page["note"])
        self.assertIn(ACTIVATION_WHY, page["why"])
        self.assertGreaterEqual(page["box"]["width"], 900)
        # Drawn: the activation band's red is on the screenshot.
        png = browser.screenshot(page["box"])
        stats = browser.evaluate("""new Promise(resolve => {
          const img = new Image();
          img.onload = () => {
            const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
            const g = c.getContext('2d'); g.drawImage(img, 0, 0);
            const d = g.getImageData(0, 0, img.width, img.height).data;
            let hits = 0;
            for (let i = 0; i < d.length; i += 4) hits += Math.abs(d[i] - 205) + Math.abs(d[i + 1] - 88) + Math.abs(d[i + 2] - 77) < 60;
            resolve(hits);
          };
          img.src = 'data:image/png;base64,%s';
        })""" % base64.b64encode(png).decode())
        self.assertGreater(stats, 500)

    # Gates and comparisons by role
    def test_check_by_role(self):
        leak = self.client("torch", "loss")
        clean = self.client("torch", "none")
        proc = self.memledger("check", leak.run_dir, "--max-growth-per-step", "activation=0")
        self.assertExit(proc, 1)
        self.assertIn("FAIL growth per step (activation)", proc.stdout)
        proc = self.memledger("check", clean.run_dir, "--max-growth-per-step", "activation=0",
                              "--max-growth-per-step", "optimizer_state=0")
        self.assertExit(proc, 0)
        self.assertIn("ok   growth per step (activation)", proc.stdout)
        proc = self.memledger("check", clean.run_dir, "--max-growth-per-step", "activations=0")
        self.assertExit(proc, 2)
        self.assertIn("unknown memory kind or role 'activations'", proc.stderr)

    def test_diff_by_role(self):
        clean = self.client("torch", "none")
        leak = self.client("torch", "optimizer")
        proc = self.memledger("diff", clean.run_dir, leak.run_dir, "--format", "json")
        self.assertExit(proc, 0)
        diff = json.loads(proc.stdout)
        growth = {f["scope"]: f for f in diff["figures"] if f["metric"] == "growth_per_step"}
        self.assertIn("optimizer_state", growth, sorted(growth))
        self.assertGreater(growth["optimizer_state"]["change"], 0.75 * leak.leak_bytes)
        self.assertEqual(len(diff["role_series"]["optimizer_state"]), STEPS)

    def test_policy_rules_come_first(self):
        run = self.client("torch", "loss")
        name, line = run.leak_site
        policy = os.path.join(self.tmpdir(), "roles.toml")
        with open(policy, "w") as f:
            f.write('[[roles.rules]]\nrole = "data"\nframes = ["py:main in */%s"]\nlifetime = "kept"\n'
                    'why = "what the validation loop keeps"\n' % name)
        proc = self.memledger("report", run.run_dir, "--format", "json", "--policy", policy)
        self.assertExit(proc, 0)
        report = json.loads(proc.stdout)
        top = report["leak_suspects"][0]
        self.assertEqual((top["role"], top["role_rule"]), ("data", "what the validation loop keeps"))
        self.assertEqual(report["roles"]["user_rules"], 1)
        with open(policy, "w") as f:
            f.write('[[roles.rules]]\nrole = "activations"\nframes = ["py:main"]\n')
        proc = self.memledger("report", run.run_dir, "--policy", policy)
        self.assertExit(proc, 2)
        self.assertIn("roles.rules[0].role: unknown role 'activations'", proc.stderr)


if __name__ == "__main__":
    mltest.main()
