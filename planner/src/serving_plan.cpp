// serving_plan.cpp — plan_serving: checks a workload, runs a serving scheduler
// (serving_scheduler.hpp) and lowers its batches into ops (see serving.hpp).
#include "tdpipe/planner/serving.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "serving_scheduler.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/serving_cost.hpp"

namespace tdpipe::planner {

using ir::Request;
using ir::ServeBatch;
using ir::ServeItem;

ir::Plan plan_serving(const ir::Scenario& scenario, const std::string& planner,
                      const std::vector<Request>& requests) {
  const auto& names = ir::serving_planner_names();
  if (std::find(names.begin(), names.end(), planner) == names.end())
    throw Error(fmt::format("unknown serving planner '{}'; expected one of: {}", planner, fmt::join(names, ", ")));
  if (!scenario.serving)
    throw Error(fmt::format("{}: no serving: section; a serving plan needs one (requests, lengths, memory)",
                            scenario.name));
  if (requests.empty()) throw Error("serving: no requests to plan");
  const ir::Scenario sc = serving_layout(scenario, planner);
  const ir::ServingConfig& cfg = *sc.serving;
  const int P = sc.parallel.pipeline;
  const ServingCost cost(sc, P);
  const long long capacity = cost.kv_capacity_blocks();
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const Request& q = requests[r];
    if (q.prompt < 1 || q.output < 1)
      throw Error(fmt::format("serving: request {}: prompt {} and output {} tokens; expected at least 1 each", r,
                              q.prompt, q.output));
    if (static_cast<long long>(q.prompt) + q.output - 1 > sc.model.seq)
      throw Error(fmt::format("serving: request {}: {} prompt + {} output tokens exceed the model's context of "
                              "model.seq = {} tokens",
                              r, q.prompt, q.output, sc.model.seq));
    // One batch holds a whole prefill (no chunked prefill, as vLLM requires without it:
    // max_num_batched_tokens ≥ the longest sequence), and the workspace is sized for it;
    // pp and tp may recompute a preempted request's prompt and generated tokens at once.
    const long long prefill = planner == "tdpipe" ? q.prompt : static_cast<long long>(q.prompt) + q.output - 1;
    if (prefill > cfg.max_batch_tokens)
      throw Error(fmt::format("serving: request {}: a prefill of up to {} tokens ({}) exceeds serving.max_batch_tokens "
                              "= {}: one batch must hold it (no chunked prefill); set max_batch_tokens ≥ {}",
                              r, prefill, planner == "tdpipe" ? "its prompt" : "its prompt and output, recomputed",
                              cfg.max_batch_tokens, prefill));
    if (ir::kv_blocks(q.prompt + q.output, cfg.block_tokens) > capacity)
      throw Error(fmt::format("serving: request {}: {} tokens need {} KV blocks of {} tokens; the GPUs hold {} (more "
                              "GPUs, a larger memory_fraction or smaller blocks)",
                              r, q.prompt + q.output, ir::kv_blocks(q.prompt + q.output, cfg.block_tokens),
                              cfg.block_tokens, capacity));
  }

  // The plan holds an item per output token (12 bytes) and 3·P ops per batch: bound it
  // before building it.
  long long outputs = 0;
  for (const Request& q : requests) outputs += q.output;
  constexpr long long kMaxOutputTokens = 200'000'000;
  if (outputs > kMaxOutputTokens)
    throw Error(fmt::format("serving: {} requests generate {} output tokens; a plan holds at most {} (one item each, "
                            "{:.1f} GiB of plan already): serve fewer requests (--count) or shorter outputs",
                            requests.size(), outputs, kMaxOutputTokens, 12.0 * kMaxOutputTokens / (1 << 30)));
  detail::Scheduler s(cfg, requests, P, capacity);
  if (planner == "tdpipe") detail::schedule_tdpipe(s, cfg, cost, P);
  else detail::schedule_continuous(s, cfg);
  const std::vector<long long> blocks_after = s.blocks_after();

  ir::Plan plan;
  plan.schedule = "serve-" + planner;
  plan.stages = P;
  plan.chunks = 1;
  plan.slices = 1;
  plan.data = 1;
  plan.lowered = true;
  plan.stage_of.assign(static_cast<std::size_t>(P), std::vector<int>{});
  for (int r = 0; r < P; ++r) plan.stage_of[static_cast<std::size_t>(r)] = {r};
  plan.scenario = sc;
  ir::ServePlan serve;
  serve.planner = planner;
  serve.requests = requests;
  serve.batches = s.take_batches();
  serve.block_tokens = cfg.block_tokens;
  serve.seed = cfg.seed;
  for (int r = 0; r < P; ++r) {
    serve.kv_bytes_per_token.push_back(cost.kv_bytes_per_token(r));
    serve.kv_capacity_bytes.push_back(static_cast<double>(capacity) * cfg.block_tokens * cost.kv_bytes_per_token(r));
  }
  const int n = static_cast<int>(serve.batches.size());
  plan.microbatches = n;

  // Where rank 0 receives each batch's tokens: in the p2p group of batch g(b), with
  // b ≤ g(b) ≤ b + P − 1, before the first batch that needs them, and non-decreasing in b
  // (the last rank sends them in that order; transfers pair by order). The bound keeps the
  // ring of rendezvous acyclic: rank 0's group b + P − 1 completes once rank 1 received
  // batch b + P − 1, which rank 1 posts after its group of batch b + P − 2, …, which waits
  // for the last rank's group of batch b — its token SEND, whose RECV must therefore be
  // posted by rank 0's group b + P − 1. The validator replays every plan, which proves it.
  std::vector<int> need(static_cast<std::size_t>(n), std::numeric_limits<int>::max());
  std::vector<int> prev(requests.size(), -1);
  std::vector<std::vector<int>> uses(static_cast<std::size_t>(n));  // batches whose tokens batch j needs
  for (int j = 0; j < n; ++j) {
    for (const ServeItem& i : serve.batches[static_cast<std::size_t>(j)].items) {
      // A request's next batch needs the token its previous batch produced (a recomputed
      // prefill too: it re-reads the tokens generated so far from rank 0's record).
      const int b = prev[static_cast<std::size_t>(i.request)];
      if (b >= 0) {
        need[static_cast<std::size_t>(b)] = std::min(need[static_cast<std::size_t>(b)], j);
        uses[static_cast<std::size_t>(j)].push_back(b);
      }
      prev[static_cast<std::size_t>(i.request)] = j;
    }
  }
  std::vector<int> group(static_cast<std::size_t>(n));
  for (int b = n - 1; b >= 0; --b) {
    long long g = static_cast<long long>(b) + P - 1;
    if (need[static_cast<std::size_t>(b)] != std::numeric_limits<int>::max())
      g = std::min<long long>(g, need[static_cast<std::size_t>(b)] - 1);
    if (b + 1 < n) g = std::min<long long>(g, group[static_cast<std::size_t>(b) + 1]);
    group[static_cast<std::size_t>(b)] = static_cast<int>(g);
  }

  // Per rank and batch j: [RECV of j's input], PREFILL/DECODE j, then one p2p group
  // posted together (non-blocking sends, as vLLM's isend): j's output SEND, the RECV of
  // j + 1's input, and on rank 0 the token RECVs placed at j. Grouping the next input
  // with this output lets a stage run ahead of its successor by a batch, as real
  // pipelines do, without the rendezvous stalling either.
  plan.ranks.assign(static_cast<std::size_t>(P), {});
  std::vector<int> recv_tok(static_cast<std::size_t>(n), -1);  // rank 0's RECV of batch b's tokens
  const double block_tokens = cfg.block_tokens;
  std::vector<int> batch_tokens(static_cast<std::size_t>(n), 0);
  for (int j = 0; j < n; ++j)
    for (const ServeItem& i : serve.batches[static_cast<std::size_t>(j)].items)
      batch_tokens[static_cast<std::size_t>(j)] += i.tokens;
  auto make = [](ir::OpKind kind, int mb) {
    ir::Op op;
    op.kind = kind;
    op.mb = mb;
    op.stream = ir::default_stream(kind);
    return op;
  };
  auto hidden_recv = [&](int r, int j) {
    ir::Op recv = make(ir::OpKind::RECV, j);
    recv.payload = ir::OpKind::F;
    recv.peer = r - 1;
    recv.bytes = static_cast<std::int64_t>(cost.hidden_bytes(batch_tokens[static_cast<std::size_t>(j)]));
    return recv;
  };
  auto token_recv = [&](int b) {
    ir::Op recv = make(ir::OpKind::RECV, b);
    recv.payload = ir::OpKind::F;
    recv.peer = P - 1;
    recv.bytes = static_cast<std::int64_t>(4 * serve.batches[static_cast<std::size_t>(b)].items.size());
    return recv;
  };
  for (int r = 0; r < P; ++r) {
    auto& ops = plan.ranks[static_cast<std::size_t>(r)];
    const bool first = r == 0, last = r == P - 1;
    std::size_t next_recv = 0;  // batches whose token RECV rank 0 has placed
    int recv_hidden = -1;       // the RECV of the next batch's input
    if (!first && n > 0) {
      recv_hidden = static_cast<int>(ops.size());
      ops.push_back(hidden_recv(r, 0));
    }
    for (int j = 0; j < n; ++j) {
      const ServeBatch& batch = serve.batches[static_cast<std::size_t>(j)];
      ir::Op op = make(batch.has_prefill() ? ir::OpKind::PREFILL : ir::OpKind::DECODE, j);
      op.est_seconds = cost.batch_seconds(r, batch.items);
      op.flops = cost.batch_flops(r, batch.items);
      op.bytes = static_cast<std::int64_t>(std::llround(static_cast<double>(blocks_after[static_cast<std::size_t>(j)]) *
                                                        block_tokens * cost.kv_bytes_per_token(r)));
      if (recv_hidden >= 0) op.deps.push_back({r, recv_hidden});
      if (first && P > 1) {
        auto& u = uses[static_cast<std::size_t>(j)];
        std::sort(u.begin(), u.end());
        u.erase(std::unique(u.begin(), u.end()), u.end());
        for (int b : u) op.deps.push_back({0, recv_tok[static_cast<std::size_t>(b)]});
      }
      const int compute = static_cast<int>(ops.size());
      ops.push_back(op);
      if (P == 1) continue;
      ir::Op send = make(ir::OpKind::SEND, j);
      send.payload = ir::OpKind::F;
      send.peer = last ? 0 : r + 1;
      send.bytes = last ? static_cast<std::int64_t>(4 * batch.items.size())
                        : static_cast<std::int64_t>(cost.hidden_bytes(batch_tokens[static_cast<std::size_t>(j)]));
      send.deps.push_back({r, compute});
      send.batch = j;
      ops.push_back(send);
      recv_hidden = -1;
      if (!first && j + 1 < n) {
        ir::Op recv = hidden_recv(r, j + 1);
        recv.batch = j;
        recv_hidden = static_cast<int>(ops.size());
        ops.push_back(recv);
      }
      if (!first) continue;
      while (next_recv < static_cast<std::size_t>(n) && group[next_recv] <= j) {
        ir::Op recv = token_recv(static_cast<int>(next_recv));
        recv.batch = j;
        recv_tok[next_recv] = static_cast<int>(ops.size());
        ops.push_back(recv);
        ++next_recv;
      }
    }
    if (first && P > 1)
      for (; next_recv < static_cast<std::size_t>(n); ++next_recv) ops.push_back(token_recv(static_cast<int>(next_recv)));
  }
  plan.serve = std::move(serve);
  return plan;
}

}  // namespace tdpipe::planner
