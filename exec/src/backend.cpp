// backend.cpp — checks shared by every backend's transport.
#include "tdpipe/exec/backend.hpp"

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec {

void check_p2p_op(const P2POp& op, int stages) {
  if (op.kind != ir::OpKind::SEND && op.kind != ir::OpKind::RECV)
    throw Error(fmt::format("transport: {} is not SEND or RECV", ir::to_string(op.kind)));
  if (op.peer < 0 || op.peer >= stages)
    throw Error(fmt::format("{}: peer {} is not a pipeline rank (p = {})", op.label, op.peer, stages));
}

std::pair<std::int64_t, std::int64_t> part_range(std::int64_t n, int index, int count) {
  if (count < 1 || index < 0 || index >= count || n < 0)
    throw Error(fmt::format("part {} of {} of {} elements: out of range", index, count, n));
  return {n * index / count, n * (index + 1) / count};
}

int owned_segment(int member, int members) {
  if (members < 1 || member < 0 || member >= members)
    throw Error(fmt::format("data-parallel member {} of {}: out of range", member, members));
  return (member + 1) % members;
}

std::vector<std::pair<std::int64_t, std::int64_t>> owned_ranges(std::int64_t n, int buckets,
                                                                const OptimizerShard& shard) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  const int seg = owned_segment(shard.member, shard.members);
  for (int k = 0; k < buckets; ++k) {
    const auto [b0, b1] = part_range(n, k, buckets);
    const auto [s0, s1] = part_range(b1 - b0, seg, shard.members);
    if (s1 > s0) out.emplace_back(b0 + s0, b0 + s1);
  }
  return out;
}

}  // namespace tdpipe::exec

namespace tdpipe::exec {

std::pair<std::int64_t, std::int64_t> onebit_bucket_range(std::int64_t n, int chunk, int chunks, int index,
                                                          int count, int members) {
  if (chunk < 0 || chunk >= chunks || count < 1 || index < 0 || index >= count || members < 1)
    throw Error(fmt::format("1-bit all-reduce of bucket {} of {} of chunk {} (this rank has {}) over {} members: "
                            "out of range", index, count, chunk, chunks, members));
  return part_range(n, index, count);
}

std::pair<std::int64_t, std::int64_t> owned_segments_offset(std::int64_t n, int index, int count, int member,
                                                            int members) {
  if (index < 0 || index >= count)
    throw Error(fmt::format("owned segment of bucket {} of {}: out of range", index, count));
  const int seg = owned_segment(member, members);
  std::int64_t offset = 0, total = 0;
  for (int k = 0; k < count; ++k) {
    const auto [b0, b1] = part_range(n, k, count);
    const auto [s0, s1] = part_range(b1 - b0, seg, members);
    if (k == index) offset = total;
    total += s1 - s0;
  }
  return {offset, total};
}

void check_onebit_messages(const OnebitMessages& m, std::int64_t bytes) {
  for (const Buffer* b : {&m.sent, &m.received, &m.gathered})
    if (b->empty() || b->dtype != DType::U8 || b->bytes() != bytes)
      throw Error(fmt::format("1-bit all-reduce: a message of {} bytes, expected {}", b->bytes(), bytes));
}

void Compute::copy(const CopyOp& op) {
  throw Error(fmt::format("this backend does not stream parameters ({} of chunk {} layer {}, parallel.param_offload: "
                          "layers); run the plan on the CPU backend, or with param_offload: none",
                          ir::to_string(op.kind), op.chunk, op.layer));
}

OnebitMessages Compute::onebit_compress(int, int, int, int) {
  throw Error("this backend does not implement 1-bit Adam's compressed all-reduce (parallel.optimizer: "
              "onebit-adam); run it on the CPU backend, or with optimizer: adam");
}
void Compute::onebit_serve(int, int, int, int, int, OnebitMessages&) {
  throw Error("this backend does not implement 1-bit Adam's compressed all-reduce (its server side)");
}
void Compute::onebit_expand(int, int, int, int, const OnebitMessages&) {
  throw Error("this backend does not implement 1-bit Adam's compressed all-reduce (its decoding)");
}

void Transport::all_to_all(const Buffer&, const Buffer&, int) {
  throw Error("this transport does not implement the all-to-all of 1-bit Adam's compressed all-reduce");
}

std::unique_ptr<P2PRequest> Transport::start(std::span<P2POp>, std::function<void()>) {
  throw Error("this transport cannot start a batch without waiting; the interpreter runs it with a thread per stream");
}

void Transport::agree_overflow(std::span<std::uint8_t>, int) {
  throw Error("this transport does not implement fp16 training's overflow agreement (model.dtype: fp16 loss "
              "scaling); run it on the CPU backend, or with model.dtype: bf16");
}

}  // namespace tdpipe::exec
