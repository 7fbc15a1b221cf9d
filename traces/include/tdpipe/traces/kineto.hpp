// kineto.hpp — Trace ⇄ Kineto JSON, the PyTorch profiler's format, one file per rank
// (what Holistic Trace Analysis reads as a job's traces).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tdpipe/traces/trace.hpp"

namespace tdpipe::traces {

/// Rank `rank`'s part of `trace` as a Kineto trace: distributedInfo {rank, world_size},
/// every op a device-side event (`cat` "kernel", args device and stream, one stream per
/// lane of a tdpipe stream so that a stream's kernels never overlap; SEND/RECV and
/// collectives named as NCCL's kernels, LOAD/OFFLOAD as memcpys, so that HTA classes them
/// as communication and memory), each with a zero-length host `cudaLaunchKernel` at its
/// start sharing its correlation id, a host-side `ProfilerStep#N` annotation over the
/// rank's ops (N: the trace's metadata "step"), the op's text form and fields in args,
/// and the trace's own fields under "tdpipe".
nlohmann::json to_kineto_json(const Trace& trace, int rank);

/// Writes `dir`/rank<R>.json for every rank, or only for `only_rank` when ≥ 0 (a process
/// of a multi-process run writing its own file); each file atomically, `dir` created.
void write_kineto_dir(const Trace& trace, const std::string& dir, int only_rank = -1);

/// Reads Kineto traces — tdpipe's (write_kineto_dir) or the PyTorch profiler's — one
/// (source name, parsed JSON) per rank's file. Each file's rank is its
/// distributedInfo.rank (a single file may omit it: rank 0). Only ranges named like
/// tdpipe ops are kept (the op's text form, or several joined by '+' for a batched p2p
/// group, as `record_function` or tdpipe's args.op carry them); an op's device-side range
/// (`gpu_user_annotation`, kernels: the GPU's time; spans sharing an External id merged)
/// is preferred over its host-side one; where files carry `ProfilerStep#N` annotations,
/// only the last step all of them share is kept (files without steps: all their ops,
/// named in the metadata). Times keep the files' common clock (ts is relative to each
/// file's baseTimeNanoseconds), shifted so that the first op starts at 0. Throws
/// tdpipe::Error naming the file and field, also when no range is named like an op.
Trace trace_from_kineto(const std::vector<std::pair<std::string, nlohmann::json>>& files);

/// trace_from_kineto one file at a time (a folder's files need not be held at once):
/// add() each rank's file, then finish().
class KinetoImport {
 public:
  /// `single_file`: a lone file may omit distributedInfo (rank 0).
  explicit KinetoImport(bool single_file);
  ~KinetoImport();
  void add(const std::string& source, const nlohmann::json& file);
  Trace finish();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

/// Whether a parsed JSON document looks like a Kineto trace (schemaVersion,
/// distributedInfo or deviceProperties at the top level, beside traceEvents).
bool is_kineto_json(const nlohmann::json& j);

}  // namespace tdpipe::traces
