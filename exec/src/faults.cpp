// faults.cpp — fault specs, the injector's bookkeeping, heartbeats.
#include "tdpipe/exec/faults.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>
#include <zlib.h>

#include "tdpipe/ir/plan_io.hpp"

namespace tdpipe::exec {

const char* to_string(FaultSpec::Kind kind) {
  switch (kind) {
    case FaultSpec::Kind::Kill: return "kill";
    case FaultSpec::Kind::Hang: return "hang";
    case FaultSpec::Kind::Drop: return "drop";
    case FaultSpec::Kind::Corrupt: return "corrupt";
    case FaultSpec::Kind::Slow: return "slow";
    case FaultSpec::Kind::CheckpointFail: return "ckpt-fail";
  }
  return "?";
}

namespace {

constexpr const char* kSpecHelp =
    "kill:rank=R,step=S[,op=OP][,times=N] | hang:rank=R,step=S[,op=OP][,times=N] | "
    "drop:rank=R,peer=Q,step=S[,message=N][,times=N] | corrupt:rank=R,peer=Q,step=S[,message=N][,times=N] | "
    "slow:rank=R,factor=F[,step=S] | ckpt-fail:step=S[,rank=R]";

int parse_int(std::string_view spec, std::string_view key, std::string_view value, int lo, int hi) {
  int v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < lo || v > hi)
    throw Error(fmt::format("--inject \"{}\": {}={} is not an integer in [{}, {}]", spec, key, value, lo, hi));
  return v;
}

}  // namespace

FaultSpec parse_fault_spec(std::string_view text) {
  FaultSpec f;
  f.text = std::string(text);
  const auto colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  using K = FaultSpec::Kind;
  static const std::map<std::string_view, K> kinds = {{"kill", K::Kill},       {"hang", K::Hang},
                                                      {"drop", K::Drop},       {"corrupt", K::Corrupt},
                                                      {"slow", K::Slow},       {"ckpt-fail", K::CheckpointFail}};
  const auto k = kinds.find(kind);
  if (k == kinds.end())
    throw Error(fmt::format("--inject \"{}\": unknown fault kind \"{}\"; expected {}", text, kind, kSpecHelp));
  f.kind = k->second;
  // Keys each kind takes, and those it needs.
  std::set<std::string_view> allowed, required;
  switch (f.kind) {
    case K::Kill:
    case K::Hang: allowed = {"rank", "step", "op", "times"}; required = {"rank", "step"}; break;
    case K::Drop:
    case K::Corrupt:
      allowed = {"rank", "peer", "step", "message", "times"};
      required = {"rank", "peer", "step"};
      break;
    case K::Slow: allowed = {"rank", "factor", "step"}; required = {"rank", "factor"}; break;
    case K::CheckpointFail: allowed = {"step", "rank"}; required = {"step"}; break;
  }
  std::set<std::string_view> seen;
  std::string_view rest = colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
      throw Error(fmt::format("--inject \"{}\": \"{}\" is not key=value; expected {}", text, item, kSpecHelp));
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (!allowed.count(key))
      throw Error(fmt::format("--inject \"{}\": {} takes no key \"{}\"; expected {}", text, kind, key, kSpecHelp));
    if (!seen.insert(key).second) throw Error(fmt::format("--inject \"{}\": key \"{}\" given twice", text, key));
    constexpr int kMax = 1 << 30;
    if (key == "rank") f.rank = parse_int(text, key, value, 0, kMax);
    else if (key == "step") f.step = parse_int(text, key, value, 0, kMax);
    else if (key == "peer") f.peer = parse_int(text, key, value, 0, kMax);
    else if (key == "message") f.message = parse_int(text, key, value, 1, kMax);
    else if (key == "times") f.times = parse_int(text, key, value, 1, 1000);
    else if (key == "op") f.op = std::string(value);
    else if (key == "factor") {
      double v = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || end != value.data() + value.size() || !(v > 1 && v <= 100))
        throw Error(fmt::format("--inject \"{}\": factor={} is not a number in (1, 100] (how many times slower)",
                                text, value));
      f.factor = v;
    }
  }
  for (std::string_view key : required)
    if (!seen.count(key))
      throw Error(fmt::format("--inject \"{}\": {} needs {}=…; expected {}", text, kind, key, kSpecHelp));
  if ((f.kind == K::Drop || f.kind == K::Corrupt) && f.peer == f.rank)
    throw Error(fmt::format("--inject \"{}\": peer {} is the rank itself; a message goes to another rank", text,
                            f.peer));
  return f;
}

namespace {
// "F5" names F5 and every part of it (F5.c1, F5.c1:s0); a full text names that op.
bool op_matches(std::string_view want, std::string_view op) {
  if (op.size() < want.size() || op.substr(0, want.size()) != want) return false;
  return op.size() == want.size() || op[want.size()] == '.' || op[want.size()] == ':';
}
}  // namespace

void check_fault_spec(const FaultSpec& f, const ir::Plan& plan, int first, int end) {
  const int p = plan.num_ranks(), world = p * std::max(1, plan.data);
  using K = FaultSpec::Kind;
  if (f.rank >= world)
    throw Error(fmt::format("--inject \"{}\": rank {} is not in the run, whose world ranks are 0 to {} "
                            "(replica · {} + pipeline rank)", f.text, f.rank, world - 1, p));
  if ((f.kind == K::Drop || f.kind == K::Corrupt) && f.peer >= world)
    throw Error(fmt::format("--inject \"{}\": peer {} is not in the run, whose world ranks are 0 to {}", f.text,
                            f.peer, world - 1));
  if (f.kind == K::CheckpointFail) {
    if (f.step <= first || f.step > end)
      throw Error(fmt::format("--inject \"{}\": this run writes checkpoints after {} to {} steps done", f.text,
                              first + 1, end));
  } else if (f.kind == FaultSpec::Kind::Slow ? f.step >= end : f.step < first || f.step >= end) {
    throw Error(fmt::format("--inject \"{}\": step {} is not in this run, which takes steps {} to {}", f.text,
                            f.step, first, end - 1));
  }
  if (!f.op.empty()) {
    const auto& ops = plan.ranks.at(static_cast<std::size_t>(f.rank % p));
    const bool found = std::any_of(ops.begin(), ops.end(), [&](const ir::Op& op) {
      return op_matches(f.op, ir::op_to_text(op));
    });
    if (!found)
      throw Error(fmt::format("--inject \"{}\": pipeline rank {} has no op \"{}\" (ops are named as in `tdpipe plan`, "
                              "e.g. F0, BW3, W2, F2.c1:s0, SEND(F0>r1))", f.text, f.rank % p, f.op));
  }
}

FaultInjector::FaultInjector(std::vector<FaultSpec> specs)
    : specs_(std::move(specs)), fired_(specs_.size(), 0), fired_attempt_(specs_.size(), -1) {}

void FaultInjector::begin_attempt() {
  std::lock_guard lock(mu_);
  ++attempt_;
}

const FaultSpec* FaultInjector::at_op(int rank, int step, std::string_view op_text) {
  if (specs_.empty()) return nullptr;
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& f = specs_[i];
    if ((f.kind != FaultSpec::Kind::Kill && f.kind != FaultSpec::Kind::Hang) || f.rank != rank || f.step != step ||
        fired_[i] >= f.times || fired_attempt_[i] == attempt_)
      continue;
    if (!f.op.empty() && !op_matches(f.op, op_text)) continue;
    ++fired_[i];
    fired_attempt_[i] = attempt_;
    return &f;
  }
  return nullptr;
}

const FaultSpec* FaultInjector::at_delivery(int from, int to, int step, int message, int /*attempt*/) {
  if (specs_.empty()) return nullptr;
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& f = specs_[i];
    if ((f.kind != FaultSpec::Kind::Drop && f.kind != FaultSpec::Kind::Corrupt) || f.rank != from || f.peer != to ||
        f.step != step || f.message != message || fired_[i] >= f.times)
      continue;
    ++fired_[i];
    return &f;
  }
  return nullptr;
}

double FaultInjector::slow_factor(int rank, int step) {
  if (specs_.empty()) return 1;
  std::lock_guard lock(mu_);
  double factor = 1;
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& f = specs_[i];
    if (f.kind != FaultSpec::Kind::Slow || f.rank != rank || step < f.step) continue;
    factor *= f.factor;
    fired_[i] = 1;
  }
  return factor;
}

const FaultSpec* FaultInjector::at_checkpoint(int steps_done, int rank) {
  if (specs_.empty()) return nullptr;
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& f = specs_[i];
    if (f.kind != FaultSpec::Kind::CheckpointFail || f.step != steps_done || f.rank != rank || fired_[i] >= 1)
      continue;
    ++fired_[i];
    return &f;
  }
  return nullptr;
}

std::vector<std::string> FaultInjector::unfired() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < specs_.size(); ++i)
    if (fired_[i] == 0) out.push_back(specs_[i].text);
  return out;
}

Heartbeats::Heartbeats(RunControl& control, int ranks, double period, double timeout)
    : control_(control),
      period_(period),
      timeout_(timeout),
      last_beat_ns_(static_cast<std::size_t>(ranks)),
      stopped_(static_cast<std::size_t>(ranks)),
      origin_(Clock::now()) {
  for (auto& b : last_beat_ns_) b.store(0);
  for (auto& s : stopped_) s.store(false);
  for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { beat_loop(r); });
  threads_.emplace_back([this] { monitor_loop(); });
}

Heartbeats::~Heartbeats() {
  {
    std::lock_guard lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void Heartbeats::stop(int rank) {
  if (rank < 0 || rank >= static_cast<int>(stopped_.size())) return;
  std::int64_t none = -1;
  stopped_at_ns_.compare_exchange_strong(none, (Clock::now() - origin_).count());
  stopped_[static_cast<std::size_t>(rank)] = true;
}

void Heartbeats::beat_loop(int rank) {
  const auto period = std::chrono::duration<double>(period_);
  std::unique_lock lock(mu_);
  while (!quit_) {
    if (!stopped_[static_cast<std::size_t>(rank)])
      last_beat_ns_[static_cast<std::size_t>(rank)] = (Clock::now() - origin_).count();
    cv_.wait_for(lock, period, [this] { return quit_.load(); });
  }
}

void Heartbeats::monitor_loop() {
  const auto tick = std::chrono::duration<double>(period_ / 2);
  const auto timeout_ns = static_cast<std::int64_t>(timeout_ * 1e9);
  std::unique_lock lock(mu_);
  while (!quit_ && !control_.failed()) {
    cv_.wait_for(lock, tick, [this] { return quit_.load(); });
    const std::int64_t now = (Clock::now() - origin_).count();
    for (std::size_t r = 0; r < last_beat_ns_.size(); ++r) {
      const std::int64_t silent = now - last_beat_ns_[r].load();
      if (silent <= timeout_ns) continue;
      silent_ = static_cast<int>(r);
      const std::int64_t at = stopped_at_ns_.load();
      detect_ns_ = at >= 0 ? now - at : silent;
      lock.unlock();
      control_.fail(fmt::format("rank {} sent no heartbeat for {:.2f} s (period {} s, timeout {} s): it is lost",
                                r, silent / 1e9, period_, timeout_),
                    /*recoverable=*/true);
      return;
    }
  }
}

std::uint32_t crc32_of(const void* data, std::size_t n) {
  return static_cast<std::uint32_t>(::crc32_z(::crc32_z(0, nullptr, 0), static_cast<const Bytef*>(data), n));
}

void check_fault_options(const FaultOptions& o) {
  if (!(o.heartbeat_period > 0 && o.heartbeat_period <= 60))
    throw Error(fmt::format("heartbeat period {} s: expected a number of seconds in (0, 60]", o.heartbeat_period));
  if (!(o.heartbeat_timeout >= 2 * o.heartbeat_period && o.heartbeat_timeout <= 3600))
    throw Error(fmt::format("heartbeat timeout {} s: expected at least two periods ({} s) and at most 3600 s, or a "
                            "rank that beats on time would be declared lost",
                            o.heartbeat_timeout, 2 * o.heartbeat_period));
  if (!(o.retry_timeout > 0 && o.retry_timeout <= 60))
    throw Error(fmt::format("retry timeout {} s: expected a number of seconds in (0, 60]", o.retry_timeout));
  if (o.max_retries < 0 || o.max_retries > 10)
    throw Error(fmt::format("max retries {}: expected 0 to 10", o.max_retries));
  if (o.max_restarts < 0 || o.max_restarts > 100)
    throw Error(fmt::format("max restarts {}: expected 0 to 100", o.max_restarts));
  if (o.checkpoint_every < 0) throw Error(fmt::format("checkpoint every {} steps: expected ≥ 0", o.checkpoint_every));
  if (o.checkpoint_every > 0 && o.checkpoint_dir.empty())
    throw Error("checkpoints every N steps need a checkpoint directory (--checkpoint-dir DIR)");
  if (o.resume && o.checkpoint_dir.empty()) throw Error("resume needs the checkpoint directory to resume from");
  if (o.checkpoint_keep < 1) throw Error(fmt::format("keep {} checkpoints: expected ≥ 1", o.checkpoint_keep));
}

}  // namespace tdpipe::exec
