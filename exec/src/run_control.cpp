// run_control.cpp — first-failure wins; a table of what each thread waits on.
#include "tdpipe/exec/run_control.hpp"

#include <fmt/format.h>

namespace tdpipe::exec {

void RunControl::fail(const std::string& message, bool recoverable) {
  {
    std::lock_guard lock(info_mu_);
    if (failed_.load()) return;
    failure_ = message;
    recoverable_.store(recoverable);
    failed_.store(true);
  }
  // Take the wait mutex so no waiter misses the wake-up between its check and wait.
  { std::lock_guard lock(mu_); }
  cv_.notify_all();
}

std::string RunControl::failure() const {
  std::lock_guard lock(info_mu_);
  return failure_;
}

void RunControl::set_waiting(int rank, ir::Stream stream, std::string what) {
  if (what.empty())
    set_waiting(rank, stream, Describe{});
  else
    set_waiting(rank, stream, Describe([w = std::move(what)] { return w; }));
}

void RunControl::set_waiting(int rank, ir::Stream stream, Describe what) {
  std::lock_guard lock(info_mu_);
  waiting_[std::make_pair(rank, static_cast<int>(stream))] = std::move(what);
}

std::string RunControl::waiting_report() const {
  std::lock_guard lock(info_mu_);
  std::string out;
  for (const auto& [key, what] : waiting_)
    if (what)
      out += fmt::format("  rank {} ({} stream): {}\n", key.first,
                         ir::to_string(static_cast<ir::Stream>(key.second)), what());
  return out;
}

}  // namespace tdpipe::exec
