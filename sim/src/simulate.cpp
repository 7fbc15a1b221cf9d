// simulate.cpp — runs the engine in a forked child (SimGrid 3.32 allows one engine per
// process), streams progress and the raw result back through a pipe, and turns op
// timings into a Trace and its metrics.
#include "tdpipe/sim/simulate.hpp"

#include <dlfcn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "engine.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "sim_metrics.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::sim {
namespace {

// ---- a tiny binary encoding for the child → parent messages ----

struct Writer {
  std::string buf;
  template <class T> void pod(T v) { buf.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(const std::string& s) {
    pod<std::uint64_t>(s.size());
    buf += s;
  }
};

struct Reader {
  const std::string& buf;
  std::size_t pos = 0;
  template <class T> T pod() {
    if (pos + sizeof(T) > buf.size()) throw Error("simulator: truncated result from the SimGrid process");
    T v;
    std::memcpy(&v, buf.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  std::string str() {
    const auto n = pod<std::uint64_t>();
    if (pos + n > buf.size()) throw Error("simulator: truncated result from the SimGrid process");
    std::string s = buf.substr(pos, n);
    pos += n;
    return s;
  }
};

std::string encode(const detail::RawResult& r) {
  Writer w;
  w.pod<std::uint64_t>(r.timing.size());
  for (const auto& rank : r.timing) {
    w.pod<std::uint64_t>(rank.size());
    for (const auto& [s, e] : rank) {
      w.pod(s);
      w.pod(e);
    }
  }
  for (const auto& rank : r.xfer_ns)
    for (auto x : rank) w.pod(x);
  w.pod(r.makespan_ns);
  w.pod<std::uint64_t>(r.links.size());
  for (const auto& l : r.links) {
    w.str(l.name);
    w.pod(l.bytes_per_second);
    w.pod(l.peak_utilisation);
    w.pod(l.mean_utilisation);
  }
  w.pod(r.gpus);
  w.pod(r.actors);
  w.pod(r.flows);
  w.str(r.collective);
  w.pod(r.trace_replica);
  w.pod(r.trace_tp);
  w.pod<std::uint64_t>(r.replicas.size());
  for (int x : r.replicas) w.pod(x);
  w.pod(r.wall_seconds);
  w.pod(r.cpu_seconds);
  w.pod(r.peak_rss_bytes);
  return w.buf;
}

detail::RawResult decode(const std::string& buf) {
  Reader rd{buf};
  detail::RawResult r;
  r.timing.resize(rd.pod<std::uint64_t>());
  for (auto& rank : r.timing) {
    rank.resize(rd.pod<std::uint64_t>());
    for (auto& [s, e] : rank) {
      s = rd.pod<std::int64_t>();
      e = rd.pod<std::int64_t>();
    }
  }
  r.xfer_ns.resize(r.timing.size());
  for (std::size_t i = 0; i < r.timing.size(); ++i)
    for (std::size_t k = 0; k < r.timing[i].size(); ++k) r.xfer_ns[i].push_back(rd.pod<std::int64_t>());
  r.makespan_ns = rd.pod<std::int64_t>();
  r.links.resize(rd.pod<std::uint64_t>());
  for (auto& l : r.links) {
    l.name = rd.str();
    l.bytes_per_second = rd.pod<double>();
    l.peak_utilisation = rd.pod<double>();
    l.mean_utilisation = rd.pod<double>();
  }
  r.gpus = rd.pod<std::int64_t>();
  r.actors = rd.pod<std::int64_t>();
  r.flows = rd.pod<std::int64_t>();
  r.collective = rd.str();
  r.trace_replica = rd.pod<int>();
  r.trace_tp = rd.pod<int>();
  r.replicas.resize(rd.pod<std::uint64_t>());
  for (int& x : r.replicas) x = rd.pod<int>();
  r.wall_seconds = rd.pod<double>();
  r.cpu_seconds = rd.pod<double>();
  r.peak_rss_bytes = rd.pod<std::int64_t>();
  return r;
}

void write_all(int fd, const std::string& data) {
  std::size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::_exit(3);
    }
    off += static_cast<std::size_t>(n);
  }
}

void send_message(int fd, char type, const std::string& payload) {
  Writer w;
  w.pod(type);
  w.pod<std::uint64_t>(payload.size());
  write_all(fd, w.buf + payload);
}

bool read_exact(int fd, char* out, std::size_t n) {
  std::size_t off = 0;
  while (off < n) {
    const ssize_t got = ::read(fd, out + off, n - off);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    off += static_cast<std::size_t>(got);
  }
  return true;
}

#ifdef TDPIPE_SIM_ENGINE_PLUGIN
// The engine plugin beside this program: TDPIPE_SIM_ENGINE names it outright; else
// lib/tdpipe/ as the install lays it out relative to bin/ (TDPIPE_SIM_ENGINE_FROM_BIN), or
// <program's folder>/../sim/ (the build tree, where apps/, tests/ and bench/ sit beside sim/).
detail::RawResult run_plugin(const ir::Plan& plan, const SimOptions& options,
                             const std::function<void(double)>& progress) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("TDPIPE_SIM_ENGINE"); env && *env) {
    candidates.emplace_back(env);
  } else {
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec)
      for (const char* rel : {TDPIPE_SIM_ENGINE_FROM_BIN, "../sim"})
        candidates.push_back((exe.parent_path() / rel / TDPIPE_SIM_ENGINE_PLUGIN).lexically_normal().string());
  }
  std::string tried;
  for (const auto& path : candidates) {
    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      tried += fmt::format("\n  {}: {}", path, ::dlerror());
      continue;
    }
    auto abi = reinterpret_cast<const char* (*)()>(::dlsym(lib, detail::kEngineAbiEntry));
    if (!abi || abi() != detail::engine_abi())
      throw Error(fmt::format("simulator: {} is the SimGrid engine of another tdpipe build ({}; this one: {}); "
                              "use the plugin built with this tdpipe",
                              path, abi ? abi() : "no ABI tag", detail::engine_abi()));
    auto entry = reinterpret_cast<detail::EngineEntry>(::dlsym(lib, detail::kEngineEntry));
    if (!entry) throw Error(fmt::format("simulator: {} has no entry point {}", path, detail::kEngineEntry));
    detail::RawResult r;
    entry(plan, options, progress, r);
    return r;  // (the library stays loaded: this child process exits next)
  }
  throw Error(fmt::format("simulator: the SimGrid engine plugin ({}) could not be loaded; tried:{}\n"
                          "(set TDPIPE_SIM_ENGINE to its path, or use --engine analytic)",
                          TDPIPE_SIM_ENGINE_PLUGIN, tried));
}
#endif

detail::RawResult run_in_child(const ir::Plan& plan, const SimOptions& options) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(fmt::format("simulator: pipe() failed: {}", std::strerror(errno)));
  // Unflushed stdio buffers would be written twice (by the child too).
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(fmt::format("simulator: fork() failed: {}", std::strerror(errno)));
  if (pid == 0) {
    ::close(fds[0]);
    // SimGrid reports deadlocks and aborts on stderr; our message says it better.
    if (!std::getenv("TDPIPE_SIM_DEBUG")) {
      const int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0) ::dup2(devnull, 2);
    }
    try {
      auto progress = [&](double f) {
        Writer w;
        w.pod(f);
        send_message(fds[1], 'P', w.buf);
      };
      const auto t0 = std::chrono::steady_clock::now();
      const std::function<void(double)> report = options.progress ? std::function<void(double)>(progress) : nullptr;
#ifdef TDPIPE_SIM_ENGINE_PLUGIN
      detail::RawResult r = run_plugin(plan, options, report);
#else
      detail::RawResult r = detail::run_engine(plan, options, report);
#endif
      r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      struct rusage usage {};
      if (::getrusage(RUSAGE_SELF, &usage) == 0) {
        r.peak_rss_bytes = std::int64_t{usage.ru_maxrss} * 1024;
        r.cpu_seconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                        1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
      }
      send_message(fds[1], 'R', encode(r));
    } catch (const std::exception& e) {
      send_message(fds[1], 'E', e.what());
    }
    ::close(fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::optional<detail::RawResult> result;
  std::string error;
  for (;;) {
    char header[sizeof(char) + sizeof(std::uint64_t)];
    if (!read_exact(fds[0], header, sizeof header)) break;
    const char type = header[0];
    std::uint64_t len;
    std::memcpy(&len, header + 1, sizeof len);
    std::string payload(len, '\0');
    if (!read_exact(fds[0], payload.data(), len)) break;
    if (type == 'P' && options.progress) {
      double f;
      std::memcpy(&f, payload.data(), sizeof f);
      options.progress(f);
    } else if (type == 'R') {
      result = decode(payload);
    } else if (type == 'E') {
      error = payload;
    }
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!error.empty()) throw Error(error);
  if (!result) {
    if (WIFSIGNALED(status))
      throw Error(fmt::format("simulator: the SimGrid process died with signal {} (rerun with "
                              "TDPIPE_SIM_DEBUG=1 to see SimGrid's output)",
                              WTERMSIG(status)));
    throw Error(fmt::format("simulator: the SimGrid process exited with status {} without a result "
                            "(rerun with TDPIPE_SIM_DEBUG=1 to see SimGrid's output)",
                            WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  }
  return *result;
}


}  // namespace

double ring_allreduce_seconds(double bytes, int n, double alpha, double beta) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / beta + 2.0 * (n - 1) * alpha;
}

double tree_allreduce_seconds(double bytes, int n, double alpha, double beta) {
  if (n <= 1) return 0;
  return 2.0 * std::ceil(std::log2(n)) * alpha + 2.0 * bytes / beta;
}

SimResult simulate(const ir::Plan& plan, const SimOptions& options) {
  const detail::RawResult raw = run_in_child(plan, options);
  SimResult out;
  traces::Trace& tr = out.trace;
  tr.origin = "simgrid";
  tr.schedule = plan.schedule;
  tr.scenario = plan.scenario.name;
  tr.ranks = plan.num_ranks();
  tr.metadata["engine"] = "simgrid";
  tr.metadata["fidelity"] = options.fidelity == Fidelity::Reduced ? "reduced" : "plain";
  tr.metadata["data_parallel"] = std::to_string(plan.data);
  if (!raw.collective.empty()) tr.metadata["collective"] = raw.collective;
  if (!options.faults.empty()) {
    std::string specs;
    for (const auto& f : options.faults) specs += (specs.empty() ? "" : " ") + f.text;
    tr.metadata["faults"] = specs;
    tr.metadata["replica"] = std::to_string(raw.trace_replica);
    tr.metadata["tp_rank"] = std::to_string(raw.trace_tp);
  }
  for (int r = 0; r < plan.num_ranks(); ++r) {
    const auto& ops = plan.ranks[r];
    for (std::size_t i = 0; i < ops.size(); ++i) {
      tr.events.push_back(traces::event_of(ops[i], r, raw.timing[r][i].first, raw.timing[r][i].second));
    }
  }
  std::stable_sort(tr.events.begin(), tr.events.end(), [](const auto& a, const auto& b) {
    return std::tie(a.rank, a.stream, a.start_ns) < std::tie(b.rank, b.stream, b.start_ns);
  });
  out.metrics = traces::compute_metrics(tr);
  out.iteration_seconds = static_cast<double>(out.metrics.iteration_ns) * 1e-9;
  out.peak_activation_bytes = detail::peak_activation_bytes(plan, raw.timing);
  detail::transfer_time(plan, raw.timing, raw.xfer_ns, out.transfer_ns, out.exposed_transfer_ns);
  out.links = raw.links;
  out.simulated_gpus = raw.gpus;
  out.actors = raw.actors;
  out.flows = raw.flows;
  out.collective = raw.collective;
  out.trace_replica = raw.trace_replica;
  out.trace_tp = raw.trace_tp;
  out.simulated_replicas = raw.replicas;
  out.engine_wall_seconds = raw.wall_seconds;
  out.engine_cpu_seconds = raw.cpu_seconds;
  out.engine_peak_rss_bytes = raw.peak_rss_bytes;
  return out;
}

}  // namespace tdpipe::sim
