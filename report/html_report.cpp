#include "html_report.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <unordered_map>

#include "environment.h"
#include "pressure.h"
#include "folded.h"
#include "job_report.h"
#include "role_report.h"
#include "trace_format.h"

namespace memledger::report {

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&quot;"; break;
        case '\'': out += "&#39;"; break;
        case '\t':
        case '\n': out += static_cast<char>(c); break;
        default: out += (c < 0x20 || c == 0x7f) ? "\xEF\xBF\xBD" : std::string(1, static_cast<char>(c));
      }
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence (no overlongs, no surrogates, <= U+10FFFF)
    // is copied; anything else becomes one U+FFFD per byte.
    size_t len = 0;
    uint32_t cp = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (s[i + k] & 0xC0) == 0x80;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (ok) {
      ok = !(len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) && !(len == 4 && (cp < 0x10000 || cp > 0x10FFFF));
    }
    if (ok) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

namespace {

namespace fs = std::filesystem;

std::string esc(std::string_view s) { return html_escape(s); }

std::string num(double v, int digits = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string bytes(double v) { return human_bytes(v); }

std::string kind_title(int kind) {
  switch (kind) {
    case 0: return "host heap";
    case 1: return "device";
    case 2: return "managed";
    case 3: return "pinned host";
    case 4: return "mapped";
  }
  return "kind " + std::to_string(kind);
}

// --- Charts ---------------------------------------------------------------------

struct Series {
  std::string name;
  std::string color;
  std::vector<double> y;  // one value per step
  bool dashed = false;
};

// A "nice" axis: 0 .. top in steps of `step` (binary units for bytes).
struct Axis {
  double top = 1;
  double step = 1;
};

Axis bytes_axis(double max) {
  Axis a;
  if (max <= 0) return a;
  static const double units[] = {1.0, 1024.0, 1048576.0, 1073741824.0, 1099511627776.0};
  static const double mults[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};  // binary units read best in powers of two
  for (double u : units) {
    for (double m : mults) {
      const double step = m * u;
      if (step * 5 >= max) {
        a.step = step;
        a.top = std::ceil(max / step) * step;
        return a;
      }
    }
  }
  a.step = max / 5;
  a.top = max;
  return a;
}

Axis count_axis(double max) {
  Axis a;
  if (max <= 1) return a;
  double p = std::pow(10.0, std::floor(std::log10(max / 8)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p * 8 >= max) {
      a.step = m * p;
      break;
    }
  }
  a.top = std::ceil(max / a.step) * a.step;
  return a;
}

// "1.5 MiB", "512 KiB", "0 B": axis labels without needless decimals.
std::string tick_bytes(double v) {
  std::string s = human_bytes(v);
  const size_t dot = s.find(".0 ");
  if (dot != std::string::npos) s.erase(dot, 2);
  return s;
}

constexpr int kChartW = 880, kChartH = 250;
constexpr int kLeft = 74, kRight = 16, kTop = 14, kBottom = 42;

// A line chart over steps 1..N with axes, units and a hover title per step.
// `step_names`: what a hover title calls each step ("step 3 (train)").
std::string line_chart(const std::string& title, const std::string& x_label, const std::vector<Series>& series,
                       const std::vector<std::string>& step_names, const std::string& note) {
  const size_t n_steps = step_names.size();
  std::ostringstream o;
  double max = 0;
  for (const Series& s : series) {
    for (double v : s.y) max = std::max(max, v);
  }
  const Axis ya = bytes_axis(max);
  const Axis xa = count_axis(static_cast<double>(n_steps));
  const double pw = kChartW - kLeft - kRight, ph = kChartH - kTop - kBottom;
  auto x_of = [&](double step) {
    return n_steps <= 1 ? kLeft + pw / 2 : kLeft + (step - 1) / static_cast<double>(n_steps - 1) * pw;
  };
  auto y_of = [&](double v) { return kTop + ph - (ya.top > 0 ? v / ya.top : 0) * ph; };

  o << "<figure class=\"chart\"><figcaption><b>" << esc(title) << "</b>";
  for (const Series& s : series) {
    o << " <span class=\"key\"><i style=\"background:" << s.color << (s.dashed ? ";opacity:.55" : "") << "\"></i>"
      << esc(s.name) << "</span>";
  }
  o << "</figcaption>\n<svg class=\"chart-svg\" viewBox=\"0 0 " << kChartW << ' ' << kChartH
    << "\" role=\"img\" aria-label=\"" << esc(title) << "\">\n";
  // Grid and y axis.
  for (double v = 0; v <= ya.top * 1.0001; v += ya.step) {
    const double y = y_of(v);
    o << "<line class=\"grid\" x1=\"" << kLeft << "\" x2=\"" << kChartW - kRight << "\" y1=\"" << num(y) << "\" y2=\""
      << num(y) << "\"/><text class=\"tick\" x=\"" << kLeft - 6 << "\" y=\"" << num(y + 4)
      << "\" text-anchor=\"end\">" << esc(tick_bytes(v)) << "</text>\n";
  }
  // x axis.
  o << "<line class=\"axis\" x1=\"" << kLeft << "\" x2=\"" << kChartW - kRight << "\" y1=\"" << kTop + ph << "\" y2=\""
    << kTop + ph << "\"/>\n";
  for (double s = xa.step < 1 ? 1 : xa.step; s <= static_cast<double>(n_steps); s += std::max(1.0, xa.step)) {
    o << "<text class=\"tick\" x=\"" << num(x_of(s)) << "\" y=\"" << kTop + ph + 16 << "\" text-anchor=\"middle\">"
      << static_cast<uint64_t>(s) << "</text>\n";
  }
  if (n_steps >= 1 && xa.step > 1) {
    o << "<text class=\"tick\" x=\"" << num(x_of(1)) << "\" y=\"" << kTop + ph + 16 << "\" text-anchor=\"middle\">1</text>\n";
  }
  o << "<text class=\"label\" x=\"" << kLeft + pw / 2 << "\" y=\"" << kChartH - 6 << "\" text-anchor=\"middle\">"
    << esc(x_label) << "</text>\n";
  o << "<text class=\"label\" transform=\"translate(14," << kTop + ph / 2
    << ") rotate(-90)\" text-anchor=\"middle\">bytes</text>\n";

  // Lines: long runs are reduced to the min and max of each pixel column.
  const size_t columns = static_cast<size_t>(pw);
  for (const Series& s : series) {
    if (s.y.empty()) continue;
    o << "<polyline class=\"line\" stroke=\"" << s.color << "\"" << (s.dashed ? " stroke-dasharray=\"6 4\"" : "")
      << " points=\"";
    if (s.y.size() <= columns * 2) {
      for (size_t k = 0; k < s.y.size(); ++k) o << num(x_of(double(k + 1))) << ',' << num(y_of(s.y[k])) << ' ';
    } else {
      const double per = static_cast<double>(s.y.size()) / static_cast<double>(columns);
      for (size_t c = 0; c < columns; ++c) {
        const size_t a = static_cast<size_t>(double(c) * per), b = std::min(s.y.size(), static_cast<size_t>(double(c + 1) * per) + 1);
        auto [lo, hi] = std::minmax_element(s.y.begin() + long(a), s.y.begin() + long(b));
        const double x = x_of(double(a + 1) + (double(b - a) - 1) / 2);
        o << num(x) << ',' << num(y_of(*lo)) << ' ' << num(x) << ',' << num(y_of(*hi)) << ' ';
      }
    }
    o << "\"/>\n";
    if (s.y.size() == 1) {
      o << "<circle cx=\"" << num(x_of(1)) << "\" cy=\"" << num(y_of(s.y[0])) << "\" r=\"3\" fill=\"" << s.color << "\"/>\n";
    }
  }
  // Hover: one transparent band per step (or group of steps) with its values.
  const size_t bands = std::min<size_t>(n_steps, 240);
  for (size_t b = 0; b < bands; ++b) {
    const size_t first = b * n_steps / bands, last = std::max(first + 1, (b + 1) * n_steps / bands);
    const size_t k = last - 1;  // the band shows its last step
    const double x0 = n_steps <= 1 ? kLeft : x_of(double(first + 1)) - pw / double(std::max<size_t>(1, n_steps - 1)) / 2;
    const double x1 = n_steps <= 1 ? kLeft + pw : x_of(double(last)) + pw / double(std::max<size_t>(1, n_steps - 1)) / 2;
    o << "<rect class=\"hover\" x=\"" << num(std::max<double>(kLeft, x0)) << "\" y=\"" << kTop << "\" width=\""
      << num(std::max(1.0, std::min<double>(kLeft + pw, x1) - std::max<double>(kLeft, x0))) << "\" height=\"" << ph
      << "\"><title>" << esc(step_names[k]);
    for (const Series& s : series) {
      if (k < s.y.size()) o << "\n" << esc(s.name) << ": " << esc(bytes(s.y[k]));
    }
    o << "</title></rect>\n";
  }
  o << "</svg>";
  if (!note.empty()) o << "<p class=\"note\">" << esc(note) << "</p>";
  o << "</figure>\n";
  return o.str();
}

std::string sparkline(const std::vector<double>& y, const std::string& color, const std::string& label) {
  std::ostringstream o;
  const int w = 120, h = 28;
  o << "<svg class=\"spark\" viewBox=\"0 0 " << w << ' ' << h << "\" width=\"" << w << "\" height=\"" << h
    << "\" role=\"img\" aria-label=\"" << esc(label) << "\"><title>" << esc(label) << "</title>";
  if (!y.empty()) {
    auto [lo_it, hi_it] = std::minmax_element(y.begin(), y.end());
    const double lo = std::min(0.0, *lo_it), hi = *hi_it > lo ? *hi_it : lo + 1;
    auto px = [&](size_t k) { return y.size() == 1 ? w / 2.0 : 2 + double(k) * (w - 4) / double(y.size() - 1); };
    auto py = [&](double v) { return h - 3 - (v - lo) / (hi - lo) * (h - 6); };
    const size_t stride = std::max<size_t>(1, y.size() / 240);
    o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
    for (size_t k = 0; k < y.size(); k += stride) o << num(px(k)) << ',' << num(py(y[k])) << ' ';
    o << num(px(y.size() - 1)) << ',' << num(py(y.back())) << "\"/>";
    o << "<circle cx=\"" << num(px(y.size() - 1)) << "\" cy=\"" << num(py(y.back())) << "\" r=\"2\" fill=\"" << color
      << "\"/>";
  }
  o << "</svg>";
  return o.str();
}

// --- Stacks ---------------------------------------------------------------------

std::string frame_html(const Frame& f) {
  std::ostringstream o;
  o << "<li" << (is_python_frame(f) ? " class=\"py\"" : "") << "><span class=\"fn\">"
    << esc(f.function.empty() ? "??" : f.function) << "</span>";
  if (!f.file.empty()) {
    o << " <span class=\"loc\">" << esc(f.file);
    if (f.line > 0) o << ':' << f.line;
    o << "</span>";
  } else if (!f.module.empty()) {
    char addr[32];
    std::snprintf(addr, sizeof addr, "0x%" PRIx64, f.address);
    o << " <span class=\"loc\">" << esc(f.module) << ' ' << addr << "</span>";
  }
  if (f.inlined) o << " <span class=\"tag\">inlined</span>";
  if (f.attributed) {
    o << " <span class=\"tag\" title=\"allocated on a thread that never ran Python, while the main thread was "
         "here\">attributed</span>";
  }
  o << "</li>";
  return o.str();
}

// Python frames first and shown; native frames folded under a summary.
std::string stack_html(const std::vector<Frame>& frames) {
  if (frames.empty()) return "<p class=\"note\">no stack recorded</p>";
  std::ostringstream o;
  std::vector<const Frame*> python, native;
  for (const Frame& f : frames) (is_python_frame(f) ? python : native).push_back(&f);
  if (!python.empty()) {
    o << "<ol class=\"stack\">";
    for (const Frame* f : python) o << frame_html(*f);
    o << "</ol>";
  }
  if (!native.empty()) {
    o << "<details class=\"native\"><summary>" << (python.empty() ? "stack" : "native frames") << " ("
      << native.size() << (native.size() == 1 ? " frame" : " frames") << ")</summary><ol class=\"stack\">";
    for (const Frame* f : native) o << frame_html(*f);
    o << "</ol></details>";
  }
  return o.str();
}

// --- Flame graph ----------------------------------------------------------------

struct FlameNode {
  std::string name;
  bool python = false;
  int64_t bytes = 0;
  uint64_t count = 0;
  std::vector<std::unique_ptr<FlameNode>> children;
  std::unordered_map<std::string, FlameNode*> by_name;
  FlameNode* child(const std::string& n, bool py) {
    auto [it, inserted] = by_name.try_emplace(n, nullptr);
    if (inserted) {
      children.push_back(std::make_unique<FlameNode>());
      children.back()->name = n;
      children.back()->python = py;
      it->second = children.back().get();
    }
    return it->second;
  }
};

uint32_t name_hash(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

std::string flame_color(const FlameNode& n, int depth) {
  char buf[48];
  const uint32_t h = name_hash(n.name);
  if (depth == 0) return "#9aa5b1";
  if (depth == 1) return "#b8c1cc";
  if (n.python) {
    std::snprintf(buf, sizeof buf, "hsl(%u,55%%,%u%%)", 200 + h % 30, 62 + (h >> 8) % 14);
  } else {
    std::snprintf(buf, sizeof buf, "hsl(%u,75%%,%u%%)", 12 + h % 34, 60 + (h >> 8) % 14);
  }
  return buf;
}

constexpr int kFlameW = 1100, kRowH = 18;
constexpr int kMaxFlameDepth = 48;

void flame_rows(const FlameNode& n, double x, double w, int depth, int64_t total, std::ostringstream& o, int& max_depth,
                size_t& drawn) {
  if (w < 0.4 || depth > kMaxFlameDepth || drawn > 4000) return;
  ++drawn;
  max_depth = std::max(max_depth, depth);
  const double y = depth * kRowH;
  o << "<g><title>" << esc(n.name) << "\n"
    << esc(bytes(double(n.bytes))) << " (" << num(total > 0 ? 100.0 * double(n.bytes) / double(total) : 0, 1) << "%), "
    << n.count << (n.count == 1 ? " allocation" : " allocations") << "</title><rect x=\"" << num(x, 2) << "\" y=\""
    << y << "\" width=\"" << num(std::max(0.5, w - 0.6), 2) << "\" height=\"" << kRowH - 1 << "\" fill=\""
    << flame_color(n, depth) << "\"/>";
  const size_t fit = w > 24 ? static_cast<size_t>((w - 6) / 6.4) : 0;
  if (fit >= 2) {
    std::string label = n.name;
    if (label.size() > fit) {
      // Cut on a character boundary, then mark the cut.
      size_t cut = fit - 1;
      while (cut > 0 && (static_cast<unsigned char>(label[cut]) & 0xC0) == 0x80) --cut;
      label = label.substr(0, cut) + "\u2026";
    }
    o << "<text x=\"" << num(x + 3, 2) << "\" y=\"" << y + 13 << "\">" << esc(label) << "</text>";
  }
  o << "</g>\n";
  double cx = x;
  for (const auto& c : n.children) {
    const double cw = n.bytes > 0 ? w * double(c->bytes) / double(n.bytes) : 0;
    flame_rows(*c, cx, cw, depth + 1, total, o, max_depth, drawn);
    cx += cw;
  }
}

void sort_flame(FlameNode& n) {
  std::stable_sort(n.children.begin(), n.children.end(),
                   [](const auto& a, const auto& b) { return a->bytes > b->bytes; });
  for (auto& c : n.children) sort_flame(*c);
}

// `what`: how the caption says the total ("live", "grew").
std::string flame_graph(const std::vector<SiteTotal>& sites, const std::string& title, const std::string& empty_note,
                        const std::string& what = "live") {
  FlameNode root;
  root.name = what == "live" ? "all live memory" : "all growth";
  for (const SiteTotal& t : sites) {
    if (t.bytes <= 0) continue;
    root.bytes += t.bytes;
    root.count += t.count;
    FlameNode* node = root.child(kind_title(format::kind_index(t.site.kind)), false);
    node->bytes += t.bytes;
    node->count += t.count;
    for (const Frame* f : flame_path(t.site.frames)) {
      node = node->child(frame_label(*f), is_python_frame(*f));
      node->bytes += t.bytes;
      node->count += t.count;
    }
  }
  std::ostringstream o;
  o << "<figure class=\"flame\"><figcaption><b>" << esc(title) << "</b> <span class=\"note\">"
    << esc(bytes(double(root.bytes))) << " " << esc(what)
    << "; width is bytes, callers above callees; hover a frame for its figures</span></figcaption>\n";
  if (root.bytes <= 0) {
    o << "<p class=\"note\">" << esc(empty_note) << "</p></figure>\n";
    return o.str();
  }
  sort_flame(root);
  std::ostringstream rows;
  int max_depth = 0;
  size_t drawn = 0;
  flame_rows(root, 0, kFlameW, 0, root.bytes, rows, max_depth, drawn);
  o << "<svg class=\"flame-svg\" viewBox=\"0 0 " << kFlameW << ' ' << (max_depth + 1) * kRowH << "\" role=\"img\" aria-label=\""
    << esc(title) << "\">\n"
    << rows.str() << "</svg></figure>\n";
  return o.str();
}

// --- Page ---------------------------------------------------------------------------

const char* kStyle = R"css(
:root{--fg:#1d2329;--muted:#5f6b76;--line:#d9dee3;--bg:#f6f7f9;--card:#fff;--accent:#2962a8}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans",sans-serif;color:var(--fg);background:var(--bg)}
main{max-width:1160px;margin:0 auto;padding:20px 24px 60px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 10px}h3{font-size:15px;margin:20px 0 8px}
code,.stack,.cmd{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,monospace;font-size:12.5px}
.cmd{color:var(--muted);word-break:break-all}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:14px 16px;margin:12px 0}
.verdict{border-left:6px solid #2e7d32;font-size:15px}
.verdict.bad{border-left-color:#c62828}.verdict.warn{border-left-color:#ef8f00}
.verdict b{font-size:16px}
.figures{display:grid;grid-template-columns:repeat(auto-fill,minmax(170px,1fr));gap:10px;margin:12px 0}
.figure{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.figure .v{font-size:19px;font-weight:600}.figure .k{color:var(--muted);font-size:12px;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%;background:var(--card);border:1px solid var(--line);border-radius:8px}
th,td{padding:6px 9px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{font-size:12px;color:var(--muted);font-weight:600;background:#fafbfc}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.grows td{background:#fff4f2}
table.job td:first-child{white-space:nowrap}
figure{margin:12px 0;background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px}
figcaption{margin-bottom:6px}
.key{color:var(--muted);font-size:12px;margin-left:10px;white-space:nowrap}
.key i{display:inline-block;width:12px;height:3px;vertical-align:middle;margin-right:4px}
svg.chart-svg,svg.flame-svg{width:100%;height:auto;display:block}
.grid{stroke:#edf0f2}.axis{stroke:#9aa5b1}
.tick{font-size:11px;fill:var(--muted)}.label{font-size:12px;fill:var(--fg)}
.line{fill:none;stroke-width:2}
.hover{fill:transparent}.hover:hover{fill:rgba(41,98,168,.08)}
.flame-svg text{font-size:11px;fill:#1d2329;pointer-events:none}
.flame-svg rect{stroke:#fff;stroke-width:.5}.flame-svg g:hover rect{stroke:#1d2329;stroke-width:1}
.note{color:var(--muted);font-size:12.5px;margin:4px 0}
.role{font-size:12.5px}.why{font-size:12.5px;color:#8a3b12}
ol.stack{margin:4px 0;padding-left:22px}ol.stack li{margin:1px 0}
li.py .fn{color:#1f5fa0;font-weight:600}.loc{color:var(--muted)}
.tag{font-size:11px;color:#7a5c00;background:#fff3c4;border-radius:3px;padding:0 4px}
details>summary{cursor:pointer;color:var(--accent)}
details.process>summary{font-size:17px;font-weight:600;color:var(--fg);margin:22px 0 6px}
nav a{margin-right:12px;color:var(--accent)}
footer{color:var(--muted);font-size:12px;margin-top:40px}
)css";

std::string verdict_class(const std::string& kind, int exit_code) {
  if (kind == "exit") return exit_code == 0 ? "verdict" : "verdict warn";
  if (kind == "exec") return "verdict";
  if (kind == "signal") return "verdict warn";
  return "verdict bad";
}

std::string figure(const std::string& value, const std::string& key) {
  return "<div class=\"figure\"><div class=\"v\">" + esc(value) + "</div><div class=\"k\">" + esc(key) + "</div></div>";
}

std::vector<double> total_live_series(const ProcessReport& p) {
  std::vector<double> y;
  for (const StepStats& s : p.steps) {
    double sum = 0;
    for (int64_t v : s.live) sum += double(v);
    y.push_back(sum);
  }
  return y;
}

// Live bytes by role at each step end (roles.h) as stacked areas: the top
// edge is the live bytes of all kinds; each band is one role, in the
// table's order, with a hover title per step.
std::string role_chart(const ProcessReport& p, const std::string& x_label, const std::vector<std::string>& step_names) {
  const RoleLive& roles = p.roles;
  const size_t n = std::min(roles.per_step.size(), step_names.size());
  if (n == 0 || p.window_seconds > 0) return {};
  static const char* const kRoleColors[] = {"#2962a8", "#8e44ad", "#d35400", "#c0392b",
                                            "#16a085", "#7f8c8d", "#d4ac0d", "#95a5a6"};
  std::vector<size_t> shown;
  for (size_t r = 0; r < roles.names.size() && r < 8; ++r) {
    bool any = false;
    for (size_t k = 0; k < n; ++k) any = any || roles.per_step[k][r] > 0;
    if (any) shown.push_back(r);
  }
  // Every byte `other` (a program no rule knows): the chart would say nothing.
  if (shown.empty() || (shown.size() == 1 && roles.names[shown[0]] == "other")) return {};
  double max = 0;
  for (size_t k = 0; k < n; ++k) {
    double sum = 0;
    for (size_t r : shown) sum += double(std::max<int64_t>(0, roles.per_step[k][r]));
    max = std::max(max, sum);
  }
  const Axis ya = bytes_axis(max);
  const Axis xa = count_axis(static_cast<double>(n));
  const double pw = kChartW - kLeft - kRight, ph = kChartH - kTop - kBottom;
  auto x_of = [&](double step) { return n <= 1 ? kLeft + pw / 2 : kLeft + (step - 1) / static_cast<double>(n - 1) * pw; };
  auto y_of = [&](double v) { return kTop + ph - (ya.top > 0 ? v / ya.top : 0) * ph; };
  // Long runs: the stack at evenly spaced steps, a few per pixel column.
  std::vector<size_t> at;
  const size_t points = std::min<size_t>(n, static_cast<size_t>(pw) * 2);
  for (size_t i = 0; i < points; ++i) at.push_back(points <= 1 ? 0 : i * (n - 1) / (points - 1));
  std::ostringstream o;
  o << "<figure class=\"chart roles\"><figcaption><b>Live bytes by role per step</b>";
  for (size_t r : shown) {
    o << " <span class=\"key\"><i style=\"background:" << kRoleColors[r] << "\"></i>" << esc(roles.names[r]) << "</span>";
  }
  o << "</figcaption>\n<svg class=\"chart-svg\" viewBox=\"0 0 " << kChartW << ' ' << kChartH
    << "\" role=\"img\" aria-label=\"Live bytes by role per step\">\n";
  for (double v = 0; v <= ya.top * 1.0001; v += ya.step) {
    const double y = y_of(v);
    o << "<line class=\"grid\" x1=\"" << kLeft << "\" x2=\"" << kChartW - kRight << "\" y1=\"" << num(y) << "\" y2=\""
      << num(y) << "\"/><text class=\"tick\" x=\"" << kLeft - 6 << "\" y=\"" << num(y + 4) << "\" text-anchor=\"end\">"
      << esc(tick_bytes(v)) << "</text>\n";
  }
  o << "<line class=\"axis\" x1=\"" << kLeft << "\" x2=\"" << kChartW - kRight << "\" y1=\"" << kTop + ph << "\" y2=\""
    << kTop + ph << "\"/>\n";
  for (double s = xa.step < 1 ? 1 : xa.step; s <= static_cast<double>(n); s += std::max(1.0, xa.step)) {
    o << "<text class=\"tick\" x=\"" << num(x_of(s)) << "\" y=\"" << kTop + ph + 16 << "\" text-anchor=\"middle\">"
      << static_cast<uint64_t>(s) << "</text>\n";
  }
  o << "<text class=\"label\" x=\"" << kLeft + pw / 2 << "\" y=\"" << kChartH - 6 << "\" text-anchor=\"middle\">"
    << esc(x_label) << "</text>\n";
  o << "<text class=\"label\" transform=\"translate(14," << kTop + ph / 2
    << ") rotate(-90)\" text-anchor=\"middle\">bytes</text>\n";
  std::vector<double> below(at.size(), 0);
  for (size_t r : shown) {
    std::vector<double> above = below;
    for (size_t i = 0; i < at.size(); ++i) above[i] += double(std::max<int64_t>(0, roles.per_step[at[i]][r]));
    o << "<polygon class=\"area\" data-role=\"" << esc(roles.names[r]) << "\" fill=\"" << kRoleColors[r]
      << "\" fill-opacity=\".75\" stroke=\"" << kRoleColors[r] << "\" points=\"";
    const double half = n <= 1 ? pw / 2 : 0;  // one step: a band across the plot
    for (size_t i = 0; i < at.size(); ++i) {
      o << num(x_of(double(at[i] + 1)) - (i == 0 ? half : 0)) << ',' << num(y_of(above[i])) << ' ';
      if (n <= 1) o << num(x_of(1) + half) << ',' << num(y_of(above[i])) << ' ';
    }
    for (size_t i = at.size(); i-- > 0;) {
      if (n <= 1) o << num(x_of(1) + half) << ',' << num(y_of(below[i])) << ' ';
      o << num(x_of(double(at[i] + 1)) - (i == 0 ? half : 0)) << ',' << num(y_of(below[i])) << ' ';
    }
    o << "\"/>\n";
    below = std::move(above);
  }
  const size_t bands = std::min<size_t>(n, 240);
  for (size_t b = 0; b < bands; ++b) {
    const size_t first = b * n / bands, last = std::max(first + 1, (b + 1) * n / bands);
    const size_t k = last - 1;
    const double half = pw / double(std::max<size_t>(1, n - 1)) / 2;
    const double x0 = n <= 1 ? kLeft : x_of(double(first + 1)) - half;
    const double x1 = n <= 1 ? kLeft + pw : x_of(double(last)) + half;
    o << "<rect class=\"hover\" x=\"" << num(std::max<double>(kLeft, x0)) << "\" y=\"" << kTop << "\" width=\""
      << num(std::max(1.0, std::min<double>(kLeft + pw, x1) - std::max<double>(kLeft, x0))) << "\" height=\"" << ph
      << "\"><title>" << esc(step_names[k]);
    for (size_t r : shown) o << "\n" << esc(roles.names[r]) << ": " << esc(bytes(double(roles.per_step[k][r])));
    o << "</title></rect>\n";
  }
  o << "</svg><p class=\"note\">What the live bytes at each step end are, by role: from each allocation's stack "
       "and when it was made and freed, by the rules of the roles table (README, \u201cRoles\u201d)"
    << (roles.user_rules ? ", with " + std::to_string(roles.user_rules) + " rules from the policy file" : std::string())
    << "; the bands add up to the live bytes of all kinds."
    << (roles.estimated ? " Sampled host mode: host bytes are split by the sampled allocations' shares." : "");
  std::string growing;
  for (const auto& [name, rate] : roles.growing) growing += (growing.empty() ? "" : ", ") + name + " " + bytes(rate) + "/step";
  if (!growing.empty()) o << " <b>Growing after the warm-up: " << esc(growing) << ".</b>";
  if (const std::string peak = roles_in_words(roles.at_peak); !peak.empty()) {
    o << " At the peak: " << esc(peak) << ".";
  }
  o << "</p></figure>\n";
  return o.str();
}

void process_charts(const ProcessReport& p, std::ostringstream& o) {
  const size_t n = p.steps.size();
  if (n == 0) {
    o << "<p class=\"note\">No steps were recorded, so there are no per-step charts. Mark steps with "
         "<code>memledger_step()</code> / <code>memledger.step()</code>, or run with <code>--step-interval SECONDS</code>.</p>\n";
    return;
  }
  const std::string x_label = "step (source: " + p.step_source + ")";
  std::vector<std::string> step_names;
  for (const StepStats& s : p.steps) {
    step_names.push_back("step " + std::to_string(s.index) + (s.label.empty() ? "" : " (" + s.label + ")"));
  }
  bool kind_seen[format::kKindCount] = {};
  bool device_held = false, device_sampled = false;
  for (const StepStats& s : p.steps) {
    for (int k = 0; k < format::kKindCount; ++k) kind_seen[k] = kind_seen[k] || s.live[k] != 0;
    device_held = device_held || s.held_device != 0;
    device_sampled = device_sampled || s.device_total != 0;
  }
  auto series_of = [&](auto value) {
    std::vector<double> y;
    y.reserve(n);
    for (const StepStats& s : p.steps) y.push_back(double(value(s)));
    return y;
  };
  const char* colors[] = {"#2962a8", "#c0392b", "#8e44ad", "#16a085", "#7f8c8d"};
  std::vector<Series> live;
  // Host figures memledger could not measure are left out, not drawn as 0.
  if (p.allocator.traced) {
    live.push_back({"host heap live", colors[0], series_of([](const StepStats& s) { return s.live[0]; }), false});
  }
  if (p.allocator.held_known) {
    live.push_back({"host heap held", colors[0], series_of([](const StepStats& s) { return s.held_host; }), true});
  }
  size_t devices = 0;
  for (const StepStats& s : p.steps) devices = std::max(devices, s.live_by_device.size());
  if (devices > 1) {
    static const char* const device_colors[] = {"#c0392b", "#e67e22", "#d4ac0d", "#a04000", "#ec7063", "#784212"};
    for (size_t d = 0; d < devices; ++d) {
      live.push_back({"device " + std::to_string(d) + " live", device_colors[d % 6], series_of([d](const StepStats& s) {
                        return d < s.live_by_device.size() ? s.live_by_device[d] : 0;
                      }),
                      false});
    }
    live.push_back({"device held (all devices)", colors[1], series_of([](const StepStats& s) { return s.held_device; }), true});
  } else if (kind_seen[1] || device_held) {
    live.push_back({"device live", colors[1], series_of([](const StepStats& s) { return s.live[1]; }), false});
    live.push_back({"device held", colors[1], series_of([](const StepStats& s) { return s.held_device; }), true});
  }
  if (kind_seen[2]) live.push_back({"managed live", colors[2], series_of([](const StepStats& s) { return s.live[2]; }), false});
  if (kind_seen[3]) live.push_back({"pinned host live", colors[3], series_of([](const StepStats& s) { return s.live[3]; }), false});
  if (kind_seen[4]) live.push_back({"mapped live", colors[4], series_of([](const StepStats& s) { return s.live[4]; }), false});
  std::string live_note = "Live: bytes requested and not yet freed, at each step end. Held: what the allocators hold from the system (the host allocator's statistics";
  live_note += (kind_seen[1] || device_held) ? "; device: granularity-rounded allocations, pools' reserve, VMM physical memory; all devices together)." : ").";
  if (p.host_mode == "sampled") live_note += " Host live totals are exact; per-site figures are sampled estimates.";
  if (!live.empty()) o << line_chart("Live and held bytes per step", x_label, live, step_names, live_note);
  o << role_chart(p, x_label, step_names);

  std::vector<Series> frag;
  if (p.allocator.traced && p.allocator.held_known) {
    frag.push_back({"host heap (held \u2212 live)", colors[0], series_of([](const StepStats& s) {
                      return std::max<int64_t>(0, static_cast<int64_t>(s.held_host) - s.live[0]);
                    }),
                    false});
  }
  if (device_held) {
    frag.push_back({"device (held \u2212 live)", colors[1], series_of([](const StepStats& s) {
                      return std::max<int64_t>(0, s.held_device - s.live[1] - s.live[2]);
                    }),
                    false});
  }
  std::string frag_note = "Fragmentation: bytes held from the system but not live.";
  if (device_held && !p.steps.back().device_holders.empty()) {
    frag_note += " Device holders at the last step:";
    for (const Holder& h : p.steps.back().device_holders) {
      frag_note += " " + h.name + " holds " + bytes(double(h.held)) + ", unused " + bytes(double(h.unused)) + ";";
    }
  }
  if (p.caching_allocator_hidden) frag_note += " " + p.caching_allocator_note;
  if (!frag.empty()) o << line_chart("Fragmentation per step", x_label, frag, step_names, frag_note);

  std::vector<Series> mem;
  mem.push_back({"host RSS", "#37474f", series_of([](const StepStats& s) { return s.rss; }), false});
  std::string mem_note = "RSS sampled at each step end.";
  double rss_max = 0;
  for (const StepStats& s : p.steps) rss_max = std::max(rss_max, double(s.rss));
  const uint64_t limit = p.verdict.cgroup_limit;
  if (limit != 0 && double(limit) <= 8 * std::max(1.0, rss_max)) {
    mem.push_back({"cgroup memory limit", "#c62828", std::vector<double>(n, double(limit)), true});
  } else if (limit != 0) {
    mem_note += " The cgroup memory limit, " + bytes(double(limit)) + ", is off this scale.";
  } else {
    mem_note += " No cgroup memory limit.";
  }
  if (device_sampled) {
    mem.push_back({"device free", colors[1], series_of([](const StepStats& s) { return s.device_free; }), false});
    mem.push_back({"device total", colors[1], series_of([](const StepStats& s) { return s.device_total; }), true});
    mem_note += " Device free/total: cuMemGetInfo of the current device at each step end.";
  }
  o << line_chart(device_sampled ? "Device free memory and host RSS against the limit" : "Host RSS against the limit",
                  x_label, mem, step_names, mem_note);
}

// What keeps a suspect's blocks alive (Python retention paths): the named
// root first, then each holder down to the owners.
std::string kept_by_html(const std::vector<KeptBy>& kept_by) {
  std::ostringstream o;
  for (const KeptBy& k : kept_by) {
    o << "<div class=\"note\">kept by: ";
    for (size_t h = 0; h < k.hops.size(); ++h) o << (h ? "<br>&nbsp;&nbsp;&larr; " : "<b>") << esc(k.hops[h]) << (h ? "" : "</b>");
    o << " (" << k.objects << (k.objects == 1 ? " object, " : " objects, ") << esc(bytes(double(k.bytes))) << ")</div>";
  }
  return o.str();
}

// A row made of several stacks below one user line (site_groups.h): how
// many, and each of them with its figure and stack, to expand.
template <typename T, typename Figure>
std::string variants_html(const T& row, Figure figure_of) {
  if (row.stacks_merged <= 1) return {};
  std::ostringstream o;
  o << "<details class=\"variants\"><summary>" << row.stacks_merged << " stacks merged";
  if (row.variants.size() < row.stacks_merged) o << " (the largest " << row.variants.size() << " listed)";
  o << "</summary><ol>";
  for (const T& v : row.variants) o << "<li>" << esc(figure_of(v)) << stack_html(v.site.frames) << "</li>";
  o << "</ol></details>";
  return o.str();
}

void site_table(const std::vector<SiteTotal>& sites, std::ostringstream& o) {
  o << "<table><thead><tr><th>site</th><th>kind</th><th class=\"n\">bytes</th><th class=\"n\">allocations</th><th>stack</th></tr></thead><tbody>\n";
  for (const SiteTotal& t : sites) {
    o << "<tr><td>" << esc(site_name(t.site))
      << variants_html(t, [](const SiteTotal& v) { return bytes(double(v.bytes)) + " in " + std::to_string(v.count); })
      << "</td><td>" << esc(kind_title(format::kind_index(t.site.kind))) << "</td><td class=\"n\">"
      << esc(leak_bytes_text(double(t.bytes), t.estimated, t.bytes_error)) << "</td><td class=\"n\">" << t.count
      << "</td><td>" << stack_html(t.site.frames)
      << "</td></tr>\n";
  }
  o << "</tbody></table>\n";
}

std::string process_figures(const ProcessReport& p) {
  return "<div class=\"figures\">" + figure(std::to_string(p.steps.size()), "steps (source: " + p.step_source + ")") +
         figure(bytes(double(p.peak.bytes)), std::string(p.allocator.traced ? "peak live" : "peak live (host heap not traced)") +
                                                 (p.peak.step ? ", " + peak_phase(p.peak, p.steps) : "")) +
         (p.total_growth.judged ? figure(bytes(p.total_growth.per_step) + "/step", "growth per step, all live bytes (what check gates on)")
                                : std::string()) +
         figure(p.leak_suspects.empty() ? "no growth" : suspect_rate_text(p.leak_suspects.front()),
                p.leak_suspects.empty()
                    ? "growth suspects: none"
                    : std::to_string(p.leak_suspects.size()) + " growth suspect" + (p.leak_suspects.size() == 1 ? "" : "s") +
                          ", top: " + site_name(p.leak_suspects.front().site)) +
         figure(leak_bytes_text(double(p.exit_leak_bytes), p.leak_counts_estimated, p.exit_leak_bytes_error), "exit leaks, " + std::string(p.leak_counts_estimated ? "about " : "") +
                                                       std::to_string(p.exit_leak_count) + " allocations") +
         figure(num(double(p.duration_ns) / 1e9, 2) + " s", "duration, " + std::to_string(p.events) + " events") +
         figure(p.host_mode, p.host_mode == "sampled" ? "host mode, mean interval " + bytes(double(p.sample_interval)) : "host mode") +
         (p.allocator.name.empty()
              ? std::string()
              : figure(p.allocator.name, p.allocator.traced ? "host allocator, " + p.allocator.reached +
                                                                 (p.allocator.held_known ? "; held from " + p.allocator.held_source
                                                                                         : "; held bytes unknown")
                                                            : "host allocator: the host heap is not traced")) +
         "</div>\n";
}

// `headline`: the stop verdict and key figures (left out when the top of the
// page shows them already).
// What grew between two step ends (the end of the warm-up and the last step
// unless chosen): the first flame graph, with no start-up in it.
void growth_view_html(const GrowthView& g, std::ostringstream& o) {
  o << "<h3>What grew</h3>\n";
  if (!g.note.empty()) {
    o << "<p class=\"note\">No growth view: " << esc(g.note) << ".</p>\n";
    return;
  }
  const std::string title = "Bytes gained between the end of step " + std::to_string(g.from_step) +
                            " and the end of step " + std::to_string(g.to_step) + " by the sites that grew" +
                            (g.estimated ? " (estimated)" : "");
  o << flame_graph(g.sites, title, "No site grew between these steps.", "grew");
}

void process_section(const ProcessReport& p, size_t index, bool root, bool open, bool headline, std::ostringstream& o) {
  const std::string id = "p" + std::to_string(index);
  o << "<details class=\"process\" id=\"" << id << "\"" << (open ? " open" : "") << "><summary>Process " << p.pid;
  if (!p.rank.empty()) o << " \u00b7 rank " << esc(p.rank);
  if (root) o << " \u00b7 root";
  o << " \u00b7 " << esc(p.verdict.kind) << "</summary>\n";
  o << "<p class=\"cmd\">" << esc(p.command) << "</p>\n";
  if (headline) {
    o << "<div class=\"card " << verdict_class(p.verdict.kind, p.verdict.exit_code) << "\"><b>Stop verdict:</b> "
      << esc(p.verdict.summary) << "</div>\n";
  }
  if (!p.verdict.crash_stack.empty()) {
    o << "<h3>Crash stack</h3><div class=\"card\">" << stack_html(p.verdict.crash_stack) << "</div>\n";
  }
  if (!p.environment.empty()) {
    o << "<h3>Environment</h3><div class=\"card\"><ul>";
    for (const std::string& line : environment_lines(p.environment)) o << "<li>" << esc(line) << "</li>";
    o << "</ul></div>\n";
  }
  if (const std::string line = pressure_line(p.host_pressure); !line.empty()) {
    o << "<p class=\"note\">" << esc(line) << "</p>\n";
  }
  if (headline) o << process_figures(p);

  for (const OomEvent& oom : p.ooms) {
    o << "<h3>CUDA out of memory: post-mortem</h3><div class=\"card verdict bad\"><p><b>"
      << esc(bytes(double(oom.requested))) << " requested on device " << oom.device << " " << esc(phase_of(oom.step, oom.ts_ns, p.steps))
      << "</b> (error " << oom.error << ")</p><div class=\"figures\">"
      << figure(bytes(double(oom.device_live)), "live on the device")
      << figure(oom.device_total ? bytes(double(oom.device_free)) + " of " + bytes(double(oom.device_total)) : "not sampled",
                "device free at the last step end")
      << figure(bytes(double(oom.held_unused)), "held by pools but unused") << "</div>";
    if (!oom.stack.empty()) {
      o << "<p>Failed at <b>" << esc(site_name(Site{0, oom.kind, oom.stack})) << "</b></p>" << stack_html(oom.stack);
    }
    o << "<p>Device live set at that moment, by site:</p>";
    site_table(oom.live_by_site, o);
    if (const std::string roles = roles_in_words(oom.live_by_role); !roles.empty()) {
      o << "<p>By role: " << esc(roles) << "</p>";
    }
    if (!oom.holders.empty()) {
      o << "<p>Holders:</p><ul>";
      for (const Holder& h : oom.holders) {
        o << "<li>" << esc(h.name) << ": holds " << esc(bytes(double(h.held))) << ", unused " << esc(bytes(double(h.unused))) << "</li>";
      }
      o << "</ul>";
    }
    o << "</div>\n";
  }

  if (!p.steps.empty()) growth_view_html(p.growth_view, o);
  o << "<h3>Memory per step</h3>\n";
  process_charts(p, o);

  o << "<h3>Growth leak suspects</h3>\n";
  if (p.leak_suspects.empty()) {
    o << "<p class=\"note\">"
      << (p.steps.size() < static_cast<size_t>(p.warmup_steps) + 3
              ? "Too few steps to judge growth (at least 3 after " + std::to_string(p.warmup_steps) + " warm-up steps)."
              : "No allocation site keeps growing after the " + std::to_string(p.warmup_steps) + " warm-up steps.")
      << "</p>\n";
  } else {
    o << "<table><thead><tr><th>#</th><th>site</th><th class=\"n\">bytes/step</th><th class=\"n\">allocations/step</th>"
         "<th class=\"n\">from step</th><th class=\"n\">monotone</th><th class=\"n\">R\u00b2</th><th class=\"n\">live at end</th>"
         "<th>live bytes per step</th></tr></thead><tbody>\n";
    for (size_t k = 0; k < p.leak_suspects.size(); ++k) {
      const LeakSuspect& s = p.leak_suspects[k];
      std::vector<double> y(s.series.begin(), s.series.end());
      o << "<tr class=\"grows\"><td>" << k + 1 << "</td><td><b>" << esc(site_name(s.site)) << "</b><br><span class=\"note\">"
        << esc(kind_title(format::kind_index(s.site.kind))) << (s.site.graph ? ", CUDA graph-owned (allocated by each launch)" : "")
        << "</span>";
      if (!s.site.role.empty()) {
        o << "<br><span class=\"role\">role: <b>" << esc(s.site.role) << "</b> (" << esc(s.site.role_rule) << ")</span>";
        if (!s.role_explanation.empty()) o << "<br><span class=\"why\">" << esc(s.role_explanation) << "</span>";
      }
      o << stack_html(s.site.frames) << kept_by_html(s.kept_by)
        << variants_html(s, [](const LeakSuspect& v) { return suspect_rate_text(v); }) << "</td><td class=\"n\">"
        << esc(s.estimated ? suspect_rate_text(s) : bytes(s.bytes_per_step)) << "</td><td class=\"n\">"
        << esc(s.estimated ? suspect_count_text(s) : num(s.allocations_per_step)) << "</td><td class=\"n\">"
        << s.first_step << "</td><td class=\"n\">" << num(s.monotonicity * 100, 0) << "%</td><td class=\"n\">"
        << num(s.r_squared, 3) << "</td><td class=\"n\">" << esc(bytes(double(s.live_at_end))) << "</td><td>"
        << sparkline(y, "#c0392b", "live bytes of this site at each step end, last " + bytes(y.empty() ? 0 : y.back()))
        << "</td></tr>\n";
    }
    o << "</tbody></table>\n";
  }

  const bool first_step_is_startup = !p.steps.empty() && p.window_seconds == 0;
  o << "<h3>Exit leaks</h3><p class=\"note\">"
    << (first_step_is_startup ? "Live at exit and allocated after the first step: "
                              : "Live at exit (no steps: all but what imports made): ")
    << esc(leak_bytes_text(double(p.exit_leak_bytes), p.leak_counts_estimated, p.exit_leak_bytes_error)) << " in "
    << (p.leak_counts_estimated ? "about " : "") << p.exit_leak_count
    << " allocations" << (p.leak_counts_estimated ? " (estimated from the sampled ones)" : "")
 << ".</p>\n";
  if (!p.exit_leaks.empty()) site_table(p.exit_leaks, o);
  if (!p.startup.empty()) {
    o << "<details><summary>"
      << (first_step_is_startup ? "One-off start-up allocations (before the first step, still live): "
                                : "Made by imports, still live: ")
      << esc(leak_bytes_text(double(p.startup_bytes), p.leak_counts_estimated, p.startup_bytes_error)) << " in "
      << (p.leak_counts_estimated ? "about " : "") << p.startup_count
      << " allocations</summary>\n";
    site_table(p.startup, o);
    o << "</details>\n";
  }

  o << "<h3>Where the memory is</h3>\n";
  o << flame_graph(p.live_at_peak,
                   "Live bytes at the peak" + (p.peak.step ? " (" + peak_phase(p.peak, p.steps) + ")" : std::string()),
                   "Nothing was live at the peak.");
  if (p.host_mode == "sampled" && !p.live_at_peak.empty()) {
    double sum = 0;
    for (const SiteTotal& t : p.live_at_peak) sum += double(t.bytes);
    o << "<p class=\"note\">Sampled host mode: the sites' bytes are estimated from sampled allocations, at the "
         "moment the estimated total was highest, and add up to "
      << esc(bytes(sum)) << "; the peak above (" << esc(bytes(double(p.peak.bytes)))
      << ") is the exact total, from the process's own counters.</p>\n";
  }
  o << flame_graph(p.live_at_end, "Live bytes at the end", "Nothing was live at the end.");
  if (p.profile_sites_dropped) {
    o << "<p class=\"note\">The " << p.profile_sites_dropped << " smallest sites are left out of the flame graphs.</p>\n";
  }

  if (!p.notes.empty()) {
    o << "<h3>Notes</h3><ul class=\"notes\">";
    for (const std::string& n : p.notes) o << "<li>" << esc(n) << "</li>";
    o << "</ul>\n";
  }
  o << "<p class=\"note\">Trace: <code>" << esc(p.trace_path) << "</code>; " << p.frames_read << " frames read";
  if (p.frames_damaged) o << ", " << p.frames_damaged << " damaged";
  if (p.truncated) o << ", truncated";
  o << "; " << p.dropped << " events dropped.</p>\n";
  o << "</details>\n";
}

void job_section(const RunReport& run, const JobSummary& job, std::ostringstream& o) {
  o << "<h2 id=\"job\">Whole job: " << run.processes.size() << " processes</h2>\n";
  o << "<div class=\"card " << (job.growing.empty() && job.died.empty() ? "verdict" : "verdict bad") << "\"><b>" << esc(job.conclusion)
    << "</b></div>\n";
  o << "<table class=\"job\"><thead><tr><th>process</th><th>role</th><th class=\"n\">steps</th><th class=\"n\">peak live</th>"
       "<th class=\"n\">live growth/step</th><th class=\"n\">suspects</th><th>top growth</th><th class=\"n\">exit leaks</th>"
       "<th>live bytes per step</th><th>stop</th></tr></thead><tbody>\n";
  for (const ProcessRow& r : job.rows) {
    const ProcessReport& p = run.processes[r.index];
    o << "<tr" << (r.suspects ? " class=\"grows\"" : "") << "><td><a href=\"#p" << r.index << "\">" << esc(r.label)
      << "</a></td><td>" << esc(r.role) << "</td><td class=\"n\">" << r.steps << "</td><td class=\"n\">"
      << esc(bytes(double(r.peak_bytes))) << "</td><td class=\"n\">"
      << (r.steps && !r.time_windows ? esc(bytes(r.live_growth_per_step)) : std::string("-")) << "</td><td class=\"n\">" << r.suspects
      << "</td><td>";
    if (r.suspects) o << esc(growth_rate_text(r, true)) << "<br><span class=\"note\">" << esc(r.top_site) << "</span>";
    o << "</td><td class=\"n\">" << esc(bytes(double(r.exit_leak_bytes))) << "</td><td>"
      << sparkline(total_live_series(p), r.suspects ? "#c0392b" : "#2962a8", "total live bytes at each step end")
      << "</td><td>" << esc(r.status) << "</td></tr>\n";
  }
  o << "</tbody></table>\n";
}

}  // namespace

std::string render_html(const RunReport& run) {
  const ProcessReport& root = run.processes[run.root];
  std::string cmd;
  for (const std::string& a : run.command) cmd += (cmd.empty() ? "" : " ") + a;
  if (cmd.empty()) cmd = root.command;
  const JobSummary job = summarize_job(run);

  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
       "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">\n"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
       "<meta name=\"generator\" content=\"memledger\">\n"
    << "<title>memledger: " << esc(fs::path(run.command.empty() ? root.command : run.command.front()).filename().string())
    << "</title>\n<style>" << kStyle << "</style></head>\n<body><main>\n";
  o << "<h1>memledger report</h1>\n<p class=\"cmd\">" << esc(cmd) << "</p>\n";
  if (!run.run_dir.empty()) o << "<p class=\"note\">Run folder: <code>" << esc(run.run_dir) << "</code></p>\n";
  for (const std::string& problem : run.problems) o << "<div class=\"card verdict warn\">" << esc(problem) << "</div>\n";

  o << "<div class=\"card " << verdict_class(root.verdict.kind, root.verdict.exit_code) << "\"><b>Stop verdict:</b> "
    << esc(root.verdict.summary) << "</div>\n";
  const bool single = run.processes.size() == 1;
  if (single) {
    o << process_figures(root);
  } else {
    size_t steps = 0;
    for (const ProcessReport& p : run.processes) steps = std::max(steps, p.steps.size());
    o << "<div class=\"figures\">" << figure(std::to_string(run.processes.size()), "processes traced")
      << figure(std::to_string(job.growing.size()), job.growing.size() == 1 ? "process grows" : "processes grow")
      << figure(std::to_string(steps), "steps (most of any process)")
      << figure(bytes(double(root.peak.bytes)), "peak live of the root process") << "</div>\n";
  }
  if (!single) {
    o << "<nav><a href=\"#job\">whole job</a>";
    for (const ProcessRow& r : job.rows) o << "<a href=\"#p" << r.index << "\">" << esc(r.label) << "</a>";
    o << "</nav>\n";
    job_section(run, job, o);
  }
  for (const ProcessRow& r : job.rows) {
    const bool is_root = r.index == run.root;
    const bool open = is_root || r.suspects > 0 || run.processes.size() <= 4;
    process_section(run.processes[r.index], r.index, is_root, open, !single, o);
  }
  o << "<footer>memledger report (schema version " << kReportSchemaVersion
    << "): a self-contained page, no script, nothing loaded from the network. Sizes in binary units (KiB = 1024 B).</footer>\n";
  o << "</main></body></html>\n";
  return o.str();
}

}  // namespace memledger::report
