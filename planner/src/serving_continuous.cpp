// serving_continuous.cpp — vLLM's continuous batching (the pp and tp planners): each
// batch decodes the requests whose token came back and admits waiting prompts while its
// token budget and the free KV blocks allow; a decode that needs a block when none is
// free preempts the batch's latest-admitted request (recomputed later).
#include <fmt/format.h>

#include "serving_scheduler.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::planner::detail {

void schedule_continuous(Scheduler& s, const ir::ServingConfig& cfg) {
  const long long watermark = std::max<long long>(1, s.capacity() / 100);
  while (!s.finished()) {
    const int j = s.next_batch();
    auto& waiting = s.waiting();
    auto admissible = [&] {
      return !waiting.empty() && s.blocks() + s.blocks_for(s.item_for(waiting.front())) <= s.capacity() - watermark;
    };
    // Decodes of the requests whose token is back; with none and no prompt to admit,
    // those of the earliest batch to return (this batch then waits for them).
    std::vector<int> decode = s.take_ready(j, cfg.max_batch_requests, false);
    if (decode.empty() && !admissible()) decode = s.take_ready(j, cfg.max_batch_requests, true);
    // A decode that needs a block when none is free preempts the batch's latest-admitted
    // request (vLLM's recompute preemption), until the rest fit.
    auto need = [&] {
      long long n = 0;
      for (int r : decode) n += s.blocks_for(s.item_for(r));
      return n;
    };
    while (!decode.empty() && s.blocks() + need() > s.capacity()) {
      s.preempt(decode.back());
      decode.pop_back();
    }
    std::vector<ServeItem> items;
    long long new_blocks = 0;
    int tokens = 0;
    for (int r : decode) {
      items.push_back(s.item_for(r));
      new_blocks += s.blocks_for(items.back());
      tokens += 1;
    }
    while (!waiting.empty() && static_cast<int>(items.size()) < cfg.max_batch_requests) {
      const ServeItem item = s.item_for(waiting.front());
      if (tokens + item.tokens > cfg.max_batch_tokens && !items.empty()) break;
      const long long blocks = s.blocks_for(item);
      if (s.blocks() + new_blocks + blocks > s.capacity() - watermark) break;
      items.push_back(item);
      new_blocks += blocks;
      tokens += item.tokens;
      waiting.pop_front();
    }
    // Everything preempted and nothing admitted: the blocks are held by requests in
    // flight; the next batch takes (or preempts) those.
    if (items.empty() && !s.running().empty()) continue;
    if (items.empty()) {
      const int r = waiting.empty() ? -1 : waiting.front();
      const int tokens = r < 0 ? 0 : s.item_for(r).tokens;  // its prompt, and what it generated if preempted
      throw Error(fmt::format("serving: request {} cannot be admitted: its prefill of {} tokens needs {} KV blocks "
                              "and the GPUs hold {} with nothing else running",
                              r, tokens, ir::kv_blocks(tokens, cfg.block_tokens), s.capacity()));
    }
    s.add(std::move(items), 0);
  }
}

}  // namespace tdpipe::planner::detail
