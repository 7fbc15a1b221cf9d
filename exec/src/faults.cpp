// faults.cpp — fault specs, the injector's bookkeeping, heartbeats.
#include "tdpipe/exec/faults.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <zlib.h>

#include "tdpipe/ir/fault_text.hpp"
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

}  // namespace

FaultSpec parse_fault_spec(std::string_view text) {
  static const std::map<std::string, ir::FaultKeys, std::less<>> kinds = {
      {"kill", {{"rank", "step", "op", "times"}, {"rank", "step"}}},
      {"hang", {{"rank", "step", "op", "times"}, {"rank", "step"}}},
      {"drop", {{"rank", "peer", "step", "message", "times"}, {"rank", "peer", "step"}}},
      {"corrupt", {{"rank", "peer", "step", "message", "times"}, {"rank", "peer", "step"}}},
      {"slow", {{"rank", "factor", "step"}, {"rank", "factor"}}},
      {"ckpt-fail", {{"step", "rank"}, {"step"}}},
  };
  using K = FaultSpec::Kind;
  static const std::map<std::string, K, std::less<>> kind_of = {
      {"kill", K::Kill}, {"hang", K::Hang}, {"drop", K::Drop},
      {"corrupt", K::Corrupt}, {"slow", K::Slow}, {"ckpt-fail", K::CheckpointFail}};
  const ir::FaultText t = ir::parse_fault_text(text, kinds, kSpecHelp);
  FaultSpec f;
  f.text = t.text;
  f.kind = kind_of.find(t.kind)->second;
  constexpr int kMax = 1 << 30;
  for (const auto& [key, value] : t.keys) {
    if (key == "rank") f.rank = ir::fault_int(t, key, value, 0, kMax);
    else if (key == "step") f.step = ir::fault_int(t, key, value, 0, kMax);
    else if (key == "peer") f.peer = ir::fault_int(t, key, value, 0, kMax);
    else if (key == "message") f.message = ir::fault_int(t, key, value, 1, kMax);
    else if (key == "times") f.times = ir::fault_int(t, key, value, 1, 1000);
    else if (key == "op") f.op = value;
    else if (key == "factor") f.factor = ir::fault_number(t, key, value, 1, true, 100, "how many times slower");
  }
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
