// op.cpp — names and classes of op kinds and streams.
#include "tdpipe/ir/op.hpp"

#include <algorithm>
#include <array>
#include <cmath>

namespace tdpipe::ir {
namespace {
constexpr std::array<std::string_view, 16> kKindNames = {
    "F", "B", "W", "BW", "OPT", "SEND", "RECV", "ALLREDUCE", "REDUCE_SCATTER",
    "ALL_GATHER", "LOAD", "OFFLOAD", "CKPT", "COMPRESSED_ALLREDUCE", "PREFILL", "DECODE"};
constexpr std::array<std::string_view, kStreamCount> kStreamNames = {"compute", "p2p", "dp", "copy"};
}  // namespace

bool is_compute(OpKind kind) { return kind <= OpKind::OPT || is_serving(kind); }
bool is_chunk_work(OpKind kind) {
  return kind == OpKind::F || kind == OpKind::B || kind == OpKind::W || kind == OpKind::BW;
}
int peak_inflight(const std::vector<Op>& rank_ops) {
  int live = 0, peak = 0;
  for (const Op& op : rank_ops) {
    if (op.kind == OpKind::F) peak = std::max(peak, ++live);
    else if (op.kind == OpKind::B || op.kind == OpKind::BW) --live;
  }
  return peak;
}

bool is_p2p(OpKind kind) { return kind == OpKind::SEND || kind == OpKind::RECV; }
bool is_collective(OpKind kind) {
  return kind == OpKind::ALLREDUCE || kind == OpKind::REDUCE_SCATTER ||
         kind == OpKind::ALL_GATHER || kind == OpKind::COMPRESSED_ALLREDUCE;
}
bool is_gradient_reduction(OpKind kind) {
  return kind == OpKind::ALLREDUCE || kind == OpKind::REDUCE_SCATTER ||
         kind == OpKind::COMPRESSED_ALLREDUCE;
}
std::int64_t compressed_bucket_bytes(std::int64_t elements, int members) {
  const std::int64_t d = std::max(1, members);
  const std::int64_t longest = (std::max<std::int64_t>(elements, 0) + d - 1) / d;
  return d * (4 + (longest + 7) / 8);
}

int gate_segment(float ready_after, int n) {
  if (n < 1) return 0;
  const double k = std::ceil(static_cast<double>(ready_after) * n - 1e-3) - 1;
  return static_cast<int>(std::clamp(k, 0.0, static_cast<double>(n - 1)));
}

std::string_view to_string(OpKind kind) { return kKindNames[static_cast<std::size_t>(kind)]; }

std::optional<OpKind> op_kind_from_string(std::string_view name) {
  for (std::size_t i = 0; i < kKindNames.size(); ++i)
    if (kKindNames[i] == name) return static_cast<OpKind>(i);
  return std::nullopt;
}

std::string_view to_string(Stream stream) {
  return kStreamNames[static_cast<std::size_t>(stream)];
}

std::optional<Stream> stream_from_string(std::string_view name) {
  for (std::size_t i = 0; i < kStreamNames.size(); ++i)
    if (kStreamNames[i] == name) return static_cast<Stream>(i);
  return std::nullopt;
}

Stream default_stream(OpKind kind) {
  if (is_p2p(kind)) return Stream::P2P;
  if (is_collective(kind)) return Stream::DP;
  if (kind == OpKind::LOAD || kind == OpKind::OFFLOAD) return Stream::Copy;
  return Stream::Compute;
}

}  // namespace tdpipe::ir
