// evaluator.cpp — the analytic engine: ir::replay with cost-model durations and
// latency + bytes/bandwidth links (placement documented in evaluator.hpp).
#include "tdpipe/planner/evaluator.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "tdpipe/ir/placement.hpp"
#include "tdpipe/ir/plan_io.hpp"

namespace tdpipe::planner {
namespace {

struct Link {
  double latency_seconds = 0;
  double bytes_per_second = 0;  ///< 0: infinite
  double seconds(double bytes) const {
    return latency_seconds + (bytes_per_second > 0 ? bytes / bytes_per_second : 0.0);
  }
};

std::int64_t to_ns(double seconds) {
  if (!(seconds > 0)) return 0;
  return std::llround(seconds * 1e9);
}

/// Where pipeline ranks' GPUs are (ir::Placement; see evaluator.hpp) and the links between them.
class Links {
 public:
  explicit Links(const ir::Plan& plan)
      : sc_(plan.scenario),
        place_{std::max(1, sc_.parallel.tensor), std::max(1, plan.num_ranks()), std::max(1, plan.data)},
        gpn_(std::max(1, sc_.cluster.gpus_per_node)) {}

  /// Node of replica d's pipeline rank r, or −1 when its TP group straddles nodes.
  long node(int d, int r) const { return place_.group_node(d, r, gpn_); }

  Link nvlink(long node_index) const {
    double bw = sc_.cluster.nvlink_bytes_per_second;
    if (!(bw > 0)) bw = gpu_of(node_index).nvlink_bytes_per_second;
    return {sc_.cluster.nvlink_latency_seconds, bw};
  }
  Link infiniband() const { return {sc_.cluster.ib_latency_seconds, sc_.cluster.ib_bytes_per_second_per_nic}; }

  Link p2p(int from, int to) const {
    if (sc_.synthetic) return {sc_.synthetic->p2p_latency_seconds, 0};
    const long a = node(0, from), b = node(0, to);
    if (a >= 0 && a == b) return nvlink(a);
    return infiniband();
  }

  Link dp(int rank, int members) const {
    if (sc_.synthetic) return {sc_.synthetic->p2p_latency_seconds, 0};
    const long first = node(0, rank);
    bool one_node = first >= 0;
    for (int d = 1; d < members && one_node; ++d) one_node = node(d, rank) == first;
    return one_node ? nvlink(first) : infiniband();
  }

 private:
  const ir::GpuSpec& gpu_of(long node_index) const {
    static const ir::GpuSpec kNone{};
    const auto& groups = sc_.cluster.groups;
    long seen = 0;
    for (const auto& g : groups) {
      seen += g.nodes;
      if (node_index < seen) return g.gpu;
    }
    return groups.empty() ? kNone : groups.back().gpu;
  }

  const ir::Scenario& sc_;
  ir::Placement place_;
  int gpn_ = 1;
};

/// Ring collective over n members: all-reduce 2(n−1)/n·S/B + 2(n−1)·α; reduce-scatter
/// and all-gather are one of its two halves.
double ring_seconds(const Link& link, int n, double bytes, bool full) {
  if (n <= 1) return 0;
  const double steps = full ? 2.0 * (n - 1) : 1.0 * (n - 1);
  const double volume = steps / n * bytes;
  return (link.bytes_per_second > 0 ? volume / link.bytes_per_second : 0.0) + steps * link.latency_seconds;
}

// 1-bit Adam's exchange of a packed message (as the SimGrid engine runs it): an
// all-to-all round, (n − 1)/n of it through the link at once, then the ring all-gather's
// n − 1 steps of 1/n: an all-reduce's volume in n latencies.
double compressed_seconds(const Link& link, int n, double bytes) {
  if (n <= 1) return 0;
  const double volume = 2.0 * (n - 1) / n * bytes;
  return (link.bytes_per_second > 0 ? volume / link.bytes_per_second : 0.0) + n * link.latency_seconds;
}

struct Tables {
  int ranks = 0;
  int data = 1;
  std::vector<Link> p2p;  ///< [from·ranks + to]
  std::vector<Link> dp;   ///< [rank]
};

}  // namespace

double p2p_seconds(const ir::Plan& plan, int from, int to, std::int64_t bytes) {
  return Links(plan).p2p(from, to).seconds(static_cast<double>(bytes));
}

double allreduce_seconds(const ir::Plan& plan, int rank, std::int64_t bytes) {
  const int n = std::max(1, plan.data);
  return ring_seconds(Links(plan).dp(rank, n), n, static_cast<double>(bytes), true);
}

double compressed_allreduce_seconds(const ir::Plan& plan, int rank, std::int64_t bytes) {
  const int n = std::max(1, plan.data);
  return compressed_seconds(Links(plan).dp(rank, n), n, static_cast<double>(bytes));
}

double reduce_scatter_seconds(const ir::Plan& plan, int rank, std::int64_t bytes) {
  const int n = std::max(1, plan.data);
  return ring_seconds(Links(plan).dp(rank, n), n, static_cast<double>(bytes), false);
}

ir::DurationFn analytic_durations(const ir::Plan& plan) {
  auto t = std::make_shared<Tables>();
  const Links place(plan);
  t->ranks = plan.num_ranks();
  t->data = std::max(1, plan.data);
  t->p2p.resize(static_cast<std::size_t>(t->ranks) * static_cast<std::size_t>(t->ranks));
  for (int a = 0; a < t->ranks; ++a)
    for (int b = 0; b < t->ranks; ++b)
      t->p2p[static_cast<std::size_t>(a) * static_cast<std::size_t>(t->ranks) + static_cast<std::size_t>(b)] =
          place.p2p(a, b);
  for (int r = 0; r < t->ranks; ++r) t->dp.push_back(place.dp(r, t->data));

  return [t](const ir::Op& op, int rank) -> std::int64_t {
    switch (op.kind) {
      case ir::OpKind::SEND:
      case ir::OpKind::RECV: {
        if (rank < 0 || rank >= t->ranks || op.peer < 0 || op.peer >= t->ranks) return 0;
        const Link& link = t->p2p[static_cast<std::size_t>(rank) * static_cast<std::size_t>(t->ranks) +
                                  static_cast<std::size_t>(op.peer)];
        return to_ns(link.seconds(static_cast<double>(op.bytes)));
      }
      case ir::OpKind::ALLREDUCE:
      case ir::OpKind::REDUCE_SCATTER:
      case ir::OpKind::ALL_GATHER:
      case ir::OpKind::COMPRESSED_ALLREDUCE: {
        if (rank < 0 || rank >= t->ranks || t->data <= 1) return 0;  // (one replica: nothing runs, as in SimGrid)
        const Link& link = t->dp[static_cast<std::size_t>(rank)];
        const double bytes = static_cast<double>(op.bytes);
        // A compressed all-reduce: its kernels, then its exchange (compressed_seconds).
        if (op.kind == ir::OpKind::COMPRESSED_ALLREDUCE)
          return to_ns(op.est_seconds + compressed_seconds(link, t->data, bytes));
        return to_ns(ring_seconds(link, t->data, bytes, op.kind == ir::OpKind::ALLREDUCE));
      }
      default:
        return to_ns(op.est_seconds);
    }
  };
}

traces::Trace evaluate(const ir::Plan& plan) {
  // Flat timing (no per-rank copy) and events filled in place: a lowered plan has
  // millions of ops, and every byte of fresh memory costs a page fault.
  const std::vector<ir::OpTiming> timing = ir::replay_flat(plan, analytic_durations(plan));
  traces::Trace trace;
  trace.origin = "analytic";
  trace.schedule = plan.schedule;
  trace.scenario = plan.scenario.name;
  trace.ranks = plan.num_ranks();
  trace.events.reserve(timing.size());
  std::size_t g = 0;
  for (int r = 0; r < plan.num_ranks(); ++r) {
    for (const ir::Op& op : plan.ranks[static_cast<std::size_t>(r)]) {
      const ir::OpTiming& t = timing[g++];
      traces::fill_event(trace.events.emplace_back(), op, r, t.start_ns, t.end_ns);
    }
  }
  trace.metadata["engine"] = "analytic";
  trace.metadata["lowered"] = plan.lowered ? "true" : "false";
  return trace;
}

}  // namespace tdpipe::planner
