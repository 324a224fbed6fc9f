#include "analysis.h"

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstring>
#include <functional>
#include <map>
#include <memory>

#include "step_inference.h"
#include "trace_format.h"

namespace memledger::report {
namespace {

namespace fmt = memledger::format;

struct LiveAlloc {
  uint64_t weight;
  uint32_t site;
  uint32_t step_born;  // 1-based step the allocation was made in
  uint8_t kind;
  uint8_t flags;
  uint8_t device;
};

constexpr uint64_t kDeviceGranularity = 2ull << 20;

// What an allocation holds from the device beyond what it asked for: plain
// device allocations are rounded to the allocation granularity; pool
// allocations are held by their pool (sampled separately); VMM physical
// allocations are granular already.
uint64_t held_for(uint8_t kind, uint8_t flags, uint64_t size) {
  if (kind == static_cast<uint8_t>(fmt::Kind::kHost)) return 0;
  if (flags & (fmt::kAllocPool | fmt::kAllocRegistered)) return 0;
  if (flags & fmt::kAllocPhysical) return size;
  if (kind == static_cast<uint8_t>(fmt::Kind::kPinnedHost)) return 0;
  return (size + kDeviceGranularity - 1) / kDeviceGranularity * kDeviceGranularity;
}

// Address spaces: the host heap, device-visible addresses (device, managed,
// pinned), and VMM physical handles.
uint64_t live_key(uint8_t kind, uint8_t flags, uint64_t addr) {
  uint64_t space = kind == static_cast<uint8_t>(fmt::Kind::kHost) ? 0 : (flags & fmt::kAllocPhysical) ? 2 : 1;
  return addr ^ (space << 60);
}

bool is_oom(int error) { return error == 2; }  // CUDA_ERROR_OUT_OF_MEMORY == cudaErrorMemoryAllocation

struct SeriesPoint {
  uint32_t step;
  int64_t live;
  uint64_t allocs;  // cumulative allocations of the site
};

struct SiteAcc {
  uint32_t stack;
  uint8_t kind;
  int64_t live = 0;
  uint64_t allocs = 0;
  bool dirty = false;
  std::vector<SeriesPoint> changes;  // at step ends where the site changed
  uint64_t count = 0;  // live allocations
  // The site's live bytes and count when the running peak was last reached,
  // valid while peak_epoch is the replay's: saved on the first change after a
  // new peak, so the peak's live set costs O(1) per event, not a copy per peak.
  int64_t peak_live = 0;
  uint64_t peak_count = 0;
  uint64_t peak_epoch = 0;
};

bool is_crash_signal(int signo) {
  return signo == SIGSEGV || signo == SIGBUS || signo == SIGABRT || signo == SIGFPE || signo == SIGILL;
}

}  // namespace

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = std::fabs(bytes);
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%s%.0f %s", bytes < 0 ? "-" : "", v, units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%s%.1f %s", bytes < 0 ? "-" : "", v, units[u]);
  }
  return buf;
}

namespace {

// Allocator plumbing that is never the user's line: skipped when naming a site.
bool is_allocator_frame(const Frame& f) {
  static const char* const kPrefixes[] = {"operator new", "operator delete", "malloc", "calloc", "realloc",
                                          "__libc_", "std::", "__gnu_cxx::", "void std::", "__cxa_",
                                          "aligned_alloc", "posix_memalign", "memalign", "strdup", "strndup",
                                          // CUDA runtime and driver entry points (a statically linked
                                          // runtime puts them inside the program itself).
                                          "cudaMalloc", "cudaHostAlloc", "cudaHostRegister", "cuMemAlloc",
                                          "cuMemCreate", "cuMemHostAlloc", "cuMemHostRegister"};
  for (const char* p : kPrefixes) {
    if (f.function.rfind(p, 0) == 0) return true;
  }
  if (f.file.rfind("/usr/include/", 0) == 0) return true;
  if (f.module.find("libcudart") != std::string::npos || f.module.find("libcuda.so") != std::string::npos) return true;
  return false;
}

}  // namespace

std::string signal_name(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  if (abbrev == nullptr) return "signal " + std::to_string(signo);
  return std::string("SIG") + abbrev;
}

LinearFit fit_line(const std::vector<double>& y) {
  LinearFit fit;
  const size_t n = y.size();
  if (n < 2) return fit;
  double mean_x = (static_cast<double>(n) - 1) / 2;
  double mean_y = 0;
  for (double v : y) mean_y += v;
  mean_y /= static_cast<double>(n);
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    double dx = static_cast<double>(i) - mean_x;
    double dy = y[i] - mean_y;
    sxy += dx * dy;
    sxx += dx * dx;
    syy += dy * dy;
  }
  fit.slope = sxy / sxx;
  fit.intercept = mean_y - fit.slope * mean_x;
  fit.r_squared = syy == 0 ? 1.0 : (sxy * sxy) / (sxx * syy);
  return fit;
}

namespace {

// Past this many points a series is thinned evenly before the pairwise
// slopes are taken (n^2/2 pairs: 2M at 2000 points).
constexpr size_t kTheilSenPoints = 2000;

}  // namespace

double theil_sen_slope(const std::vector<double>& y) {
  std::vector<size_t> xs;
  const size_t n = y.size();
  if (n <= kTheilSenPoints) {
    for (size_t i = 0; i < n; ++i) xs.push_back(i);
  } else {
    for (size_t i = 0; i < kTheilSenPoints; ++i) xs.push_back(i * (n - 1) / (kTheilSenPoints - 1));
  }
  std::vector<double> slopes;
  slopes.reserve(xs.size() * (xs.size() - 1) / 2);
  for (size_t a = 0; a < xs.size(); ++a) {
    for (size_t b = a + 1; b < xs.size(); ++b) {
      slopes.push_back((y[xs[b]] - y[xs[a]]) / static_cast<double>(xs[b] - xs[a]));
    }
  }
  if (slopes.empty()) return 0;
  const size_t mid = slopes.size() / 2;
  std::nth_element(slopes.begin(), slopes.begin() + static_cast<long>(mid), slopes.end());
  const double upper = slopes[mid];
  if (slopes.size() % 2) return upper;
  const double lower = *std::max_element(slopes.begin(), slopes.begin() + static_cast<long>(mid));
  return (lower + upper) / 2;
}


namespace {

// Hands the trace's events to the replay, in sequence order, a batch at a time.
using EventFeed = std::function<void(const EventBatchFn&)>;

ProcessReport analyze_events(const Trace& trace, const EventFeed& feed, const ExitInfo& exit_info,
                             const AnalysisOptions& options) {
  ProcessReport r;
  r.trace_path = trace.path;
  r.pid = trace.pid();
  r.ppid = std::atoi(trace.header_value("ppid", "0").c_str());
  r.command = trace.command_line();
  r.host_mode = trace.header_value("host_mode", "unknown");
  r.sample_interval = std::strtoull(trace.header_value("sample_interval", "0").c_str(), nullptr, 10);
  r.rank = trace.header_value("rank");
  r.local_rank = trace.header_value("local_rank");
  r.world_size = trace.header_value("world_size");
  r.host = trace.header_value("host");
  r.start_mono_ns = std::strtoull(trace.header_value("start_mono_ns", "0").c_str(), nullptr, 10);
  const bool sampled = r.host_mode == "sampled";

  // --- Replay -------------------------------------------------------------
  absl::flat_hash_map<uint64_t, LiveAlloc> live;
  live.reserve(1 << 16);
  absl::flat_hash_map<uint64_t, uint32_t> site_index;  // (kind << 32 | stack) -> index
  std::vector<SiteAcc> sites;
  std::vector<uint32_t> dirty;
  int64_t total[fmt::kKindCount] = {};
  std::vector<int64_t> device_live;  // device kind, by device ordinal
  auto count_device = [&](const LiveAlloc& a, int64_t sign) {
    if (a.kind != static_cast<uint8_t>(fmt::Kind::kDevice)) return;
    if (a.device >= device_live.size()) device_live.resize(a.device + 1u, 0);
    device_live[a.device] += sign * static_cast<int64_t>(a.weight);
  };
  int64_t running_total = 0;
  uint32_t current_step = 1;  // allocations before the first marker belong to step 1
  uint64_t step_allocs = 0, step_frees = 0;
  std::string source;
  CuptiMatcher cupti(trace);

  uint64_t peak_epoch = 0;  // bumped at every new peak
  auto remember_peak = [&](SiteAcc& acc) {
    if (acc.peak_epoch == peak_epoch) return;
    acc.peak_epoch = peak_epoch;
    acc.peak_live = acc.live;
    acc.peak_count = acc.count;
  };
  auto site_of = [&](uint32_t stack, uint8_t kind) -> uint32_t {
    uint64_t key = (static_cast<uint64_t>(kind) << 32) | stack;
    auto [it, inserted] = site_index.try_emplace(key, static_cast<uint32_t>(sites.size()));
    if (inserted) {
      SiteAcc acc;
      acc.stack = stack;
      acc.kind = kind;
      acc.peak_epoch = peak_epoch;
      sites.push_back(std::move(acc));
    }
    return it->second;
  };
  int64_t held_plain = 0;  // granularity-rounded device allocations and VMM physical memory
  int64_t live_plain = 0;  // what the program asked for of those
  size_t vmm_i = 0, dev_i = 0, pool_i = 0;
  uint64_t reserved_va = 0;
  absl::flat_hash_map<uint64_t, uint64_t> reservations;
  absl::flat_hash_map<uint64_t, TracePoolSample> pools;  // latest sample per pool
  std::map<uint32_t, TraceDeviceSample> devices;          // latest sample per device
  // Side records (VMM, device and pool samples) that happened before `seq`.
  auto catch_up = [&](uint64_t seq) {
    for (; vmm_i < trace.vmm.size() && trace.vmm[vmm_i].seq < seq; ++vmm_i) {
      const TraceVmmEvent& v = trace.vmm[vmm_i];
      if (v.type == TraceVmmEvent::Type::kReserve) {
        reservations[v.addr] = v.size;
        reserved_va += v.size;
      } else if (v.type == TraceVmmEvent::Type::kUnreserve) {
        auto it = reservations.find(v.addr);
        if (it != reservations.end()) {
          reserved_va -= it->second;
          reservations.erase(it);
        }
      }
    }
    for (; dev_i < trace.device_samples.size() && trace.device_samples[dev_i].seq < seq; ++dev_i) {
      devices[trace.device_samples[dev_i].device] = trace.device_samples[dev_i];
    }
    for (; pool_i < trace.pool_samples.size() && trace.pool_samples[pool_i].seq < seq; ++pool_i) {
      pools[trace.pool_samples[pool_i].pool] = trace.pool_samples[pool_i];
    }
  };
  auto pool_holders = [&](std::vector<Holder>& out, uint64_t& held, uint64_t& unused) {
    std::vector<const TracePoolSample*> sorted;
    for (const auto& [pool, p] : pools) sorted.push_back(&p);
    std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->pool < b->pool; });
    for (const TracePoolSample* p : sorted) {
      char name[96];
      std::snprintf(name, sizeof name, "memory pool 0x%llx on device %u", static_cast<unsigned long long>(p->pool),
                    p->device);
      out.push_back(Holder{name, p->reserved, p->reserved > p->used ? p->reserved - p->used : 0});
      held += p->reserved;
      unused += out.back().unused;
    }
  };
  std::vector<std::pair<uint32_t, TraceEvent>> oom_points;  // (index into r.ooms, event)
  bool pool_allocs = false;  // the program allocates from memory pools itself
  uint64_t stackless = 0;    // allocations recorded without a stack

  auto on_event = [&](const TraceEvent& e) {
    catch_up(e.seq);
    switch (e.type) {
      case EvType::kAlloc: {
        if (e.flags & fmt::kAllocFailed) {
          ++r.failed_allocations;
          const int error = static_cast<int>(e.addr);
          if (is_oom(error) && r.ooms.size() < 16) {
            OomEvent oom;
            oom.requested = e.size;
            oom.error = error;
            oom.device = e.device;
            oom.kind = e.kind;
            oom.step = current_step;
            oom.ts_ns = e.ts;
            oom.device_live = total[static_cast<int>(fmt::Kind::kDevice)] + total[static_cast<int>(fmt::Kind::kManaged)];
            auto dev = devices.find(e.device);
            if (dev != devices.end()) {
              oom.device_free = dev->second.free;
              oom.device_total = dev->second.total;
            }
            uint64_t held_pools = 0;
            pool_holders(oom.holders, held_pools, oom.held_unused);
            // The device live set by site, right now.
            absl::flat_hash_map<uint32_t, std::pair<int64_t, uint64_t>> by_site;
            for (const auto& [key, a] : live) {
              if (a.kind == static_cast<uint8_t>(fmt::Kind::kHost) || a.kind == static_cast<uint8_t>(fmt::Kind::kPinnedHost)) continue;
              auto& b = by_site[a.site];
              b.first += static_cast<int64_t>(a.weight);
              b.second += 1;
            }
            for (const auto& [site, v] : by_site) {
              SiteTotal t;
              t.site.stack = sites[site].stack;
              t.site.kind = sites[site].kind;
              t.bytes = v.first;
              t.count = v.second;
              oom.live_by_site.push_back(std::move(t));
            }
            std::sort(oom.live_by_site.begin(), oom.live_by_site.end(),
                      [](const SiteTotal& a, const SiteTotal& b) { return a.bytes > b.bytes; });
            if (oom.live_by_site.size() > 10) oom.live_by_site.resize(10);
            oom_points.emplace_back(static_cast<uint32_t>(r.ooms.size()), e);
            r.ooms.push_back(std::move(oom));
          }
          break;
        }
        const uint64_t weight = e.size;
        const uint32_t s = site_of(e.stack, e.kind);
        if (e.stack == 0) ++stackless;
        if (e.flags & fmt::kAllocPool) pool_allocs = true;
        if (const uint64_t h = held_for(e.kind, e.flags, e.size)) {
          held_plain += static_cast<int64_t>(h);
          live_plain += static_cast<int64_t>(weight);
        }
        auto [it, inserted] =
            live.try_emplace(live_key(e.kind, e.flags, e.addr), LiveAlloc{weight, s, current_step, e.kind, e.flags, e.device});
        if (!inserted) {
          // The previous owner of this address was freed without a record
          // (dropped event): retire it.
          ++r.double_allocations;
          SiteAcc& old = sites[it->second.site];
          remember_peak(old);
          old.live -= static_cast<int64_t>(it->second.weight);
          --old.count;
          if (!old.dirty) {
            old.dirty = true;
            dirty.push_back(it->second.site);
          }
          total[it->second.kind & 3] -= static_cast<int64_t>(it->second.weight);
          count_device(it->second, -1);
          running_total -= static_cast<int64_t>(it->second.weight);
          if (const uint64_t h = held_for(it->second.kind, it->second.flags, it->second.weight)) {
            held_plain -= static_cast<int64_t>(h);
            live_plain -= static_cast<int64_t>(it->second.weight);
          }
          it->second = LiveAlloc{weight, s, current_step, e.kind, e.flags, e.device};
        }
        SiteAcc& acc = sites[s];
        remember_peak(acc);
        acc.live += static_cast<int64_t>(weight);
        ++acc.count;
        ++acc.allocs;
        if (!acc.dirty) {
          acc.dirty = true;
          dirty.push_back(s);
        }
        total[e.kind & 3] += static_cast<int64_t>(weight);
        count_device(it->second, 1);
        running_total += static_cast<int64_t>(weight);
        ++step_allocs;
        if (running_total > r.peak.bytes) {
          ++peak_epoch;
          r.peak.bytes = running_total;
          r.peak.step = current_step;
          r.peak.ts_ns = e.ts;
          r.peak.kind = e.kind;
        }
        break;
      }
      case EvType::kFree: {
        auto it = live.find(live_key(e.kind, e.flags, e.addr));
        if (it == live.end()) {
          // Sampled mode records only the frees of sampled allocations, so a
          // miss there is unusual too.
          ++r.unknown_frees;
          break;
        }
        SiteAcc& acc = sites[it->second.site];
        remember_peak(acc);
        acc.live -= static_cast<int64_t>(it->second.weight);
        --acc.count;
        if (!acc.dirty) {
          acc.dirty = true;
          dirty.push_back(it->second.site);
        }
        total[it->second.kind & 3] -= static_cast<int64_t>(it->second.weight);
        count_device(it->second, -1);
        running_total -= static_cast<int64_t>(it->second.weight);
        if (const uint64_t h = held_for(it->second.kind, it->second.flags, it->second.weight)) {
          held_plain -= static_cast<int64_t>(h);
          live_plain -= static_cast<int64_t>(it->second.weight);
        }
        live.erase(it);
        ++step_frees;
        break;
      }
      case EvType::kStep: {
        StepStats st;
        st.index = r.steps.size() + 1;
        st.source = e.flags == kInferredStepSource ? "auto" : fmt::step_source_name(static_cast<fmt::StepSource>(e.flags));
        if (source.empty()) {
          source = st.source;
        } else if (source != st.source && source.find(st.source) == std::string::npos) {
          source += "+" + st.source;
        }
        auto label = trace.strings.find(static_cast<uint32_t>(e.size));
        if (e.size != 0 && label != trace.strings.end()) st.label = label->second;
        st.end_ns = e.ts;
        for (int k = 0; k < fmt::kKindCount; ++k) st.live[k] = total[k];
        st.live_by_device = device_live;
        // Device samples are taken just before the step marker.
        catch_up(e.seq);
        {
          uint64_t held_pools = 0, unused_pools = 0;
          pool_holders(st.device_holders, held_pools, unused_pools);
          st.held_device = held_plain + static_cast<int64_t>(held_pools);
          if (held_plain > 0) {
            st.device_holders.insert(
                st.device_holders.begin(),
                Holder{"cudaMalloc/cuMemAlloc allocations (2 MiB granularity) and VMM physical memory",
                       static_cast<uint64_t>(held_plain), static_cast<uint64_t>(std::max<int64_t>(0, held_plain - live_plain))});
          }
          auto dev = devices.begin();
          if (dev != devices.end()) {
            st.device_free = dev->second.free;
            st.device_total = dev->second.total;
          }
          st.reserved_address_space = reserved_va;
        }
        st.allocations = step_allocs;
        st.frees = step_frees;
        step_allocs = step_frees = 0;
        for (uint32_t s : dirty) {
          SiteAcc& acc = sites[s];
          acc.dirty = false;
          acc.changes.push_back(SeriesPoint{static_cast<uint32_t>(st.index), acc.live, acc.allocs});
        }
        dirty.clear();
        r.steps.push_back(std::move(st));
        ++current_step;
        break;
      }
    }
  };
  feed([&](const TraceEvent* batch, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      on_event(batch[i]);
      cupti.observe(batch[i]);
    }
    r.events += count;
  });
  // The side records are complete once the events are (stream_trace).
  catch_up(UINT64_MAX);
  r.cupti = cupti.finish();
  r.dropped = trace.dropped;
  r.frames_read = trace.frames_read;
  r.frames_damaged = trace.frames_damaged;
  r.truncated = trace.truncated;
  r.duration_ns = trace.last_ts;
  r.notes.insert(r.notes.begin(), trace.problems.begin(), trace.problems.end());
  r.step_source = source.empty() ? "none" : source;

  // --- Samples: held bytes, RSS, and (sampled mode) exact live totals -------
  {
    size_t si = 0;
    for (StepStats& st : r.steps) {
      while (si < trace.samples.size() && trace.samples[si].ts < st.end_ns) ++si;
      const TraceSample* s = nullptr;
      if (si < trace.samples.size()) {
        s = &trace.samples[si];
      } else if (!trace.samples.empty()) {
        s = &trace.samples.back();
      }
      if (s != nullptr) {
        st.held_host = s->heap_held;
        st.rss = s->rss;
        if (sampled) st.live[0] = s->host_live;
      }
    }
    if (sampled) {
      // The exact totals come from the samples (every 100 ms and at each step end).
      r.peak = Peak{};
      uint64_t step_at = 1;
      size_t k = 0;
      for (const TraceSample& s : trace.samples) {
        while (k < r.steps.size() && r.steps[k].end_ns < s.ts) {
          ++k;
          step_at = k + 1;
        }
        if (s.host_live > r.peak.bytes) {
          r.peak.bytes = s.host_live;
          r.peak.ts_ns = s.ts;
          r.peak.step = r.steps.empty() ? 0 : std::min<uint64_t>(step_at, r.steps.size() + 1);
          r.peak.kind = 0;
        }
      }
      r.notes.push_back("sampled host mode: per-site figures are estimates from allocations sampled every " +
                        human_bytes(static_cast<double>(r.sample_interval)) +
                        " on average; totals are exact (usable bytes); run with --host full for exact sites");
    }
  }
  if (r.steps.empty()) r.peak.step = 0;

  // --- Symbolization (only for what is shown) --------------------------------
  std::unique_ptr<Symbolizer> symbolizer;
  auto make_site = [&](uint32_t stack, uint8_t kind) {
    Site site;
    site.stack = stack;
    site.kind = kind;
    auto it = trace.stacks.find(stack);
    if (it == trace.stacks.end()) return site;
    if (!symbolizer) {
      symbolizer = std::make_unique<Symbolizer>(trace.modules, options.symbolizer);
      symbolizer->set_python(&trace.python_codes, trace.python_module);
    }
    for (size_t i = 0; i < it->second.size(); ++i) {
      const auto& chain = symbolizer->resolve(it->second[i], i > 0);
      site.frames.insert(site.frames.end(), chain.begin(), chain.end());
    }
    return site;
  };

  // --- Growth leak suspects --------------------------------------------------
  const size_t n_steps = r.steps.size();
  int warmup = options.warmup_steps;
  if (warmup < 0) warmup = std::clamp(static_cast<int>(n_steps / 10), 1, 10);
  r.warmup_steps = warmup;
  if (n_steps >= static_cast<size_t>(warmup) + 3) {
    const size_t first = static_cast<size_t>(warmup) + 1;  // first step in the window (1-based)
    const size_t window = n_steps - first + 1;
    for (const SiteAcc& acc : sites) {
      if (acc.changes.empty()) continue;
      // Dense series of live bytes at each step end.
      std::vector<int64_t> series(n_steps, 0);
      std::vector<uint64_t> allocs(n_steps, 0);
      size_t c = 0;
      int64_t value = 0;
      uint64_t count = 0;
      for (size_t k = 1; k <= n_steps; ++k) {
        while (c < acc.changes.size() && acc.changes[c].step == k) {
          value = acc.changes[c].live;
          count = acc.changes[c].allocs;
          ++c;
        }
        series[k - 1] = value;
        allocs[k - 1] = count;
      }
      std::vector<double> y(series.begin() + static_cast<long>(first - 1), series.end());
      const double growth = y.back() - y.front();
      if (growth <= 0) continue;
      // In sampled mode one sampled allocation weighs about the sample
      // interval: a site whose estimate moves by a few samples between step
      // ends may be sampling noise (a per-step temporary caught live at some
      // step ends and not others, a bounded prefetch queue), not growth. A
      // leak must gain at least four samples' worth over the window.
      if (sampled && acc.kind == static_cast<uint8_t>(fmt::Kind::kHost) &&
          growth < 4.0 * static_cast<double>(r.sample_interval)) {
        continue;
      }
      LinearFit fit = fit_line(y);
      if (fit.slope <= 0 || fit.slope * static_cast<double>(window) < 1024) continue;
      size_t non_decreasing = 0;
      for (size_t i = 1; i < y.size(); ++i) non_decreasing += y[i] >= y[i - 1];
      const double monotonicity = static_cast<double>(non_decreasing) / static_cast<double>(y.size() - 1);
      if (monotonicity < 0.75) continue;
      // One or two jumps are not steady growth: a long-lived object made late
      // (in sampled mode, one sample weighs a whole interval) looks like one.
      size_t rises = 0;
      for (size_t i = 1; i < y.size(); ++i) rises += y[i] > y[i - 1];
      if (rises < 3) continue;
      // A cache that fills up and stops is not a leak: the last third must still grow.
      const size_t tail = std::max<size_t>(2, y.size() / 3);
      std::vector<double> last(y.end() - static_cast<long>(tail), y.end());
      const LinearFit tail_fit = fit_line(last);
      if (last.back() <= last.front() || tail_fit.slope < 0.25 * fit.slope) continue;
      // Most pairs of steps must show growth: a series that stays level
      // between a few jumps (the last step ending as teardown begins, a
      // worker's burst caught live twice) has a Theil-Sen slope of zero.
      if (theil_sen_slope(y) <= 0) continue;
      LeakSuspect s;
      s.site.stack = acc.stack;
      s.site.kind = acc.kind;
      s.bytes_per_step = fit.slope;
      s.r_squared = fit.r_squared;
      s.monotonicity = monotonicity;
      s.allocations_per_step =
          static_cast<double>(allocs[n_steps - 1] - allocs[first - 2 < n_steps ? first - 2 : 0]) /
          static_cast<double>(window);
      for (size_t k = 0; k < n_steps; ++k) {
        if (series[k] > (k == 0 ? 0 : series[k - 1])) {
          s.first_step = k + 1;
          break;
        }
      }
      s.live_at_end = acc.live;
      s.series = std::move(series);
      r.leak_suspects.push_back(std::move(s));
    }
    std::sort(r.leak_suspects.begin(), r.leak_suspects.end(),
              [](const LeakSuspect& a, const LeakSuspect& b) { return a.bytes_per_step > b.bytes_per_step; });
    if (r.leak_suspects.size() > options.max_suspects) r.leak_suspects.resize(options.max_suspects);
    for (LeakSuspect& s : r.leak_suspects) s.site = make_site(s.site.stack, s.site.kind);
  } else if (n_steps > 0) {
    r.notes.push_back("only " + std::to_string(n_steps) + " steps after " + std::to_string(warmup) +
                      " warm-up steps: too few to judge growth (need at least 3 after warm-up)");
  } else {
    r.notes.push_back(
        "no steps were recorded: growth per step cannot be judged. Mark steps with memledger_step() / "
        "memledger.step(), or use --step-interval SECONDS");
  }

  // --- Exit leaks and start-up allocations ------------------------------------
  {
    absl::flat_hash_map<uint32_t, std::pair<int64_t, uint64_t>> exit_by_site, startup_by_site;
    for (const auto& [addr, a] : live) {
      auto& bucket = (!r.steps.empty() && a.step_born == 1) ? startup_by_site[a.site] : exit_by_site[a.site];
      bucket.first += static_cast<int64_t>(a.weight);
      bucket.second += 1;
    }
    auto collect = [&](auto& by_site, std::vector<SiteTotal>& out, int64_t& bytes, uint64_t& count) {
      for (const auto& [s, v] : by_site) {
        SiteTotal t;
        t.site.stack = sites[s].stack;
        t.site.kind = sites[s].kind;
        t.bytes = v.first;
        t.count = v.second;
        bytes += v.first;
        count += v.second;
        out.push_back(std::move(t));
      }
      std::sort(out.begin(), out.end(), [](const SiteTotal& a, const SiteTotal& b) {
        return a.bytes != b.bytes ? a.bytes > b.bytes : a.site.stack < b.site.stack;
      });
      if (out.size() > options.max_exit_sites) out.resize(options.max_exit_sites);
      for (SiteTotal& t : out) t.site = make_site(t.site.stack, t.site.kind);
    };
    collect(exit_by_site, r.exit_leaks, r.exit_leak_bytes, r.exit_leak_count);
    collect(startup_by_site, r.startup, r.startup_bytes, r.startup_count);
  }

  // --- Live set by site at the peak and at the end (flame graphs, pprof) -------
  {
    auto snapshot = [&](bool at_peak, std::vector<SiteTotal>& out) {
      for (const SiteAcc& acc : sites) {
        const bool saved = at_peak && acc.peak_epoch == peak_epoch;
        const int64_t bytes = saved ? acc.peak_live : acc.live;
        const uint64_t count = saved ? acc.peak_count : acc.count;
        if (bytes <= 0 && count == 0) continue;
        SiteTotal t;
        t.site.stack = acc.stack;
        t.site.kind = acc.kind;
        t.bytes = bytes;
        t.count = count;
        out.push_back(std::move(t));
      }
      std::sort(out.begin(), out.end(), [](const SiteTotal& a, const SiteTotal& b) {
        return a.bytes != b.bytes ? a.bytes > b.bytes : a.site.stack < b.site.stack;
      });
      if (out.size() > options.max_profile_sites) {
        r.profile_sites_dropped = std::max<uint64_t>(r.profile_sites_dropped, out.size() - options.max_profile_sites);
        out.resize(options.max_profile_sites);
      }
      for (SiteTotal& t : out) t.site = make_site(t.site.stack, t.site.kind);
    };
    if (r.peak.bytes > 0) snapshot(true, r.live_at_peak);
    snapshot(false, r.live_at_end);
  }

  for (size_t i = 0; i < r.ooms.size(); ++i) {
    for (const auto& [index, e] : oom_points) {
      if (index == i) r.ooms[i].stack = make_site(e.stack, e.kind).frames;
    }
    for (SiteTotal& t : r.ooms[i].live_by_site) t.site = make_site(t.site.stack, t.site.kind);
  }
  if (!r.ooms.empty()) {
    r.notes.push_back(std::to_string(r.failed_allocations) + " device allocations failed, " +
                      std::to_string(r.ooms.size()) + " of them out of memory");
  }

  // A framework caching allocator: the driver sees its segments, not tensors.
  {
    std::string framework;
    for (const ModuleInfo& m : trace.modules) {
      if (m.path.find("libtorch_cuda") != std::string::npos) framework = "PyTorch";
      if (m.path.find("libtensorflow_framework") != std::string::npos || m.path.find("_pywrap_tensorflow") != std::string::npos) framework = "TensorFlow";
      if (m.path.find("xla_extension") != std::string::npos || m.path.find("jaxlib") != std::string::npos) framework = "JAX";
    }
    bool device_seen = false;
    for (const StepStats& st : r.steps) device_seen = device_seen || st.live[1] != 0;
    if (!framework.empty() && !pool_allocs && (device_seen || !trace.vmm.empty())) {
      r.caching_allocator_hidden = true;
      r.caching_allocator_note = framework +
                                 "'s caching allocator hands tensors out of large segments: the driver sees only the "
                                 "segments, so sites and growth here are per segment, not per tensor. Rerun with "
                                 "`memledger run --leak-mode` (" +
                                 (framework == "PyTorch" ? std::string("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync")
                                  : framework == "TensorFlow" ? std::string("TF_GPU_ALLOCATOR=cuda_malloc_async")
                                                              : std::string("XLA_PYTHON_CLIENT_ALLOCATOR=platform")) +
                                 ") to see every tensor allocation.";
      r.notes.push_back(r.caching_allocator_note);
    }
  }

  // --- Stop verdict -------------------------------------------------------------
  Verdict& v = r.verdict;
  if (!trace.samples.empty()) {
    const TraceSample& last = trace.samples.back();
    v.last_rss = last.rss;
    v.cgroup_limit = last.cgroup_limit;
    v.cgroup_usage = last.cgroup_usage;
  }
  const TraceSignal* sig = trace.signals.empty() ? nullptr : &trace.signals.front();
  auto near_limit = [&]() {
    return v.cgroup_limit != 0 && (v.last_rss >= v.cgroup_limit * 9 / 10 || v.cgroup_usage >= v.cgroup_limit * 95 / 100);
  };
  auto killed_verdict = [&](const std::string& how) {
    if (near_limit()) {
      v.kind = "host_oom_kill";
      v.summary = how + ": host out of memory (OOM killer) likely: last RSS " + human_bytes(double(v.last_rss)) +
                  " against a cgroup limit of " + human_bytes(double(v.cgroup_limit));
    } else {
      v.kind = "killed";
      v.summary = how + (v.cgroup_limit ? "; last RSS " + human_bytes(double(v.last_rss)) + " of a cgroup limit of " +
                                              human_bytes(double(v.cgroup_limit)) + ", not near the limit"
                                        : "; last RSS " + human_bytes(double(v.last_rss)) + ", no cgroup memory limit");
    }
  };
  int signo = 0;
  if (exit_info.known && exit_info.signaled) {
    signo = exit_info.signo;
  } else if (!exit_info.known && sig != nullptr && !trace.has_exit) {
    signo = sig->signo;
  }
  const bool ended_badly = (exit_info.known && (exit_info.signaled || exit_info.code != 0)) ||
                           (!exit_info.known && ((trace.has_exit && trace.exit_status != 0) || sig != nullptr));
  if (!r.ooms.empty() && ended_badly && (signo == 0 || signo == SIGABRT || signo == SIGKILL)) {
    const OomEvent& oom = r.ooms.back();
    v.kind = "cuda_oom";
    v.exit_code = exit_info.known ? exit_info.code : trace.exit_status;
    v.signo = signo;
    if (signo) v.signal_name = signal_name(signo);
    v.summary = "CUDA out of memory: " + human_bytes(double(oom.requested)) + " requested on device " +
                std::to_string(oom.device) + " in step " + std::to_string(oom.step) + "; " +
                human_bytes(double(oom.device_live)) + " live";
    if (oom.device_total) {
      v.summary += ", " + human_bytes(double(oom.device_free)) + " free of " + human_bytes(double(oom.device_total)) +
                   " at the last step end";
    }
    if (oom.held_unused) v.summary += ", " + human_bytes(double(oom.held_unused)) + " held by pools but unused";
  } else if (signo != 0) {
    v.signo = signo;
    v.signal_name = signal_name(signo);
    if (is_crash_signal(signo)) {
      v.kind = "crash";
      v.summary = "crashed with " + v.signal_name;
      if (sig != nullptr && sig->signo == signo) {
        v.fault_addr = sig->fault_addr;
        if (signo == SIGSEGV || signo == SIGBUS) {
          char buf[64];
          std::snprintf(buf, sizeof buf, " at address 0x%llx", static_cast<unsigned long long>(sig->fault_addr));
          v.summary += buf;
        }
        v.crash_stack = make_site(sig->stack, 0).frames;
      }
    } else if (signo == SIGKILL) {
      killed_verdict("killed by SIGKILL");
    } else {
      v.kind = "signal";
      v.summary = "terminated by " + v.signal_name;
    }
  } else if (exit_info.known) {
    v.kind = "exit";
    v.exit_code = exit_info.code;
    v.summary = exit_info.code == 0 ? "clean exit (code 0)" : "exited with code " + std::to_string(exit_info.code);
  } else if (trace.has_exit) {
    v.kind = "exit";
    v.exit_code = trace.exit_status;
    v.summary = trace.exit_status == 0 ? "clean exit (code 0)" : "exited with code " + std::to_string(trace.exit_status);
  } else if (!trace.execs.empty()) {
    v.kind = "exec";
    v.summary = "replaced itself with exec(" + trace.execs.back() + ")";
  } else if (trace.has_end) {
    v.kind = "exit";
    v.summary = "exited (status not recorded)";
  } else {
    killed_verdict("stopped without warning (SIGKILL or a crash of the tracer's writer); the trace covers up to " +
                   std::to_string(trace.last_ts / 1000000) + " ms");
  }

  // --- Integrity notes --------------------------------------------------------------
  if (r.dropped) {
    r.notes.push_back(std::to_string(r.dropped) +
                      " events were dropped because a thread's buffer was full: per-site figures may be low");
  }
  if (stackless > 0 && trace.header_value("stack_depth", "1") != "0") {
    r.notes.push_back(std::to_string(stackless) + " of " + std::to_string(r.events) +
                      " events are allocations recorded without a call stack (the tracer's table of distinct "
                      "stacks was full, or the stack was taken while a fork was under way); they are grouped "
                      "under one unnamed site");
  }
  if (r.unknown_frees && !sampled) {
    r.notes.push_back(std::to_string(r.unknown_frees) +
                      " frees of addresses the trace never saw allocated (allocated before tracing started, "
                      "or inherited from a parent process)");
  }
  if (!trace.tracer_error.empty()) r.notes.push_back("the tracer stopped itself: " + trace.tracer_error);
  if (!trace.python_note.empty()) r.notes.push_back(trace.python_note);
  // --- CUPTI beside the hooks -------------------------------------------------
  if (r.cupti.compared) {
    for (CuptiMismatch& m : r.cupti.hooks_only_list) m.frames = make_site(m.stack, m.kind).frames;
    if (r.cupti.hooks_only || r.cupti.cupti_only) {
      r.notes.push_back("CUPTI and the CUDA hooks disagree: " + std::to_string(r.cupti.hooks_only) +
                        " allocations seen only by the hooks (" + human_bytes(double(r.cupti.hooks_only_bytes)) +
                        "), " + std::to_string(r.cupti.cupti_only) + " seen only by CUPTI (" +
                        human_bytes(double(r.cupti.cupti_only_bytes)) + "); see the CUPTI section");
    }
    if (r.cupti.cupti_dropped) {
      r.notes.push_back("CUPTI lost " + std::to_string(r.cupti.cupti_dropped) +
                        " activity records: the comparison with the hooks is incomplete");
    }
    if (!r.cupti.end_message.empty() && r.cupti.end_message.find("handed over") != std::string::npos) {
      r.notes.push_back(r.cupti.end_message);
    }
  } else if (r.cupti.status != "none") {
    // CUPTI missing: what the report lacks, and why.
    r.notes.push_back(r.cupti.message.empty() ? "CUPTI was not used (" + r.cupti.status + ")" : r.cupti.message);
  }
  if (symbolizer) {
    for (const std::string& w : symbolizer->warnings()) r.notes.push_back(w);
  }
  return r;
}

// Replays the events; when they hold no step at all, infers the steps from
// the allocations (step_inference.h) and replays them again with those
// steps. `rewind` puts the trace back as it was before the first replay.
ProcessReport analyze_with_auto_steps(const Trace& trace, const EventFeed& feed, const std::function<void()>& rewind,
                                      const ExitInfo& exit_info, const AnalysisOptions& options) {
  AllocationSequence sequence(trace);
  ProcessReport r = analyze_events(
      trace,
      [&](const EventBatchFn& on_events) {
        feed([&](const TraceEvent* events, size_t count) {
          sequence.observe(events, count);
          on_events(events, count);
        });
      },
      exit_info, options);
  if (sequence.saw_steps()) return r;
  InferredSteps inferred = infer_steps(sequence.symbols(), sequence.freed_at());
  if (inferred.ends.empty()) {
    r.notes.push_back("automatic steps: " + inferred.description);
    return r;
  }
  rewind();
  r = analyze_events(
      trace,
      [&](const EventBatchFn& on_events) {
        StepInserter insert(sequence.step_end_events(inferred), on_events);
        feed(std::ref(insert));
        insert.finish();
      },
      exit_info, options);
  r.step_inference = inferred.description;
  if (sequence.truncated()) {
    r.step_inference += " (in the first " + std::to_string(sequence.symbols().size()) + " allocations)";
  }
  return r;
}

}  // namespace

ProcessReport analyze(const Trace& trace, const ExitInfo& exit_info, const AnalysisOptions& options) {
  return analyze_with_auto_steps(
      trace, [&](const EventBatchFn& on_events) { on_events(trace.events.data(), trace.events.size()); }, [] {},
      exit_info, options);
}

ProcessReport analyze_stream(Trace& trace, const ExitInfo& exit_info, const AnalysisOptions& options) {
  const Trace before = trace;  // header only: the events are streamed
  return analyze_with_auto_steps(
      trace, [&](const EventBatchFn& on_events) { stream_trace(trace, on_events); }, [&] { trace = before; },
      exit_info, options);
}

// A CUDA runtime or driver API entry point (cudaMallocAsync, cuMemAlloc_v2):
// what lies inside it is the library's business, even when a statically
// linked runtime puts it inside the program with symbols.
bool is_cuda_api(const std::string& function) {
  if (function.size() > 4 && function.compare(0, 4, "cuda") == 0 && std::isupper(static_cast<unsigned char>(function[4]))) {
    return true;
  }
  return function.size() > 2 && function.compare(0, 2, "cu") == 0 && std::isupper(static_cast<unsigned char>(function[2]));
}

// Index of the first frame that is the user's code rather than allocator
// plumbing: past the outermost CUDA API frame, then past allocator frames.
// Python source that belongs to the interpreter or an installed package
// (the standard library, site-packages, dist-packages, frozen modules), not
// to the program being traced.
bool is_library_python_file(const std::string& file) {
  if (file.empty() || file.front() == '<') return true;
  if (file.find("/site-packages/") != std::string::npos || file.find("/dist-packages/") != std::string::npos) {
    return true;
  }
  // The standard library: .../lib/python3.11/...
  const size_t lib = file.find("/lib/python");
  return lib != std::string::npos && lib + 11 < file.size() && std::isdigit(static_cast<unsigned char>(file[lib + 11]));
}

size_t user_frame_index(const std::vector<Frame>& frames) {
  // Python frames come first: the innermost one in the program's own files
  // (not in a framework or the standard library) is the program's line;
  // else the innermost Python frame.
  size_t first_python = frames.size();
  for (size_t i = 0; i < frames.size() && frames[i].python; ++i) {
    if (frames[i].function.empty()) continue;
    if (first_python == frames.size()) first_python = i;
    if (!is_library_python_file(frames[i].file)) return i;
  }
  if (first_python != frames.size()) return first_python;
  size_t start = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    if (is_cuda_api(frames[i].function)) start = i + 1;
  }
  for (size_t i = start; i < frames.size(); ++i) {
    if (!is_allocator_frame(frames[i]) && !frames[i].function.empty()) return i;
  }
  return start < frames.size() ? start : 0;
}

}  // namespace memledger::report
