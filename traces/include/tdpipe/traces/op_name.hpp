// op_name.hpp — reads an op's text form (the event names tdpipe traces carry) back
// into its fields, so that foreign tools' traces of tdpipe runs keep their meaning.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tdpipe/ir/op.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::traces {

struct ParsedOpName {
  ir::OpKind kind = ir::OpKind::F;
  ir::OpKind payload = ir::OpKind::F;  ///< SEND/RECV: what they carry
  int mb = -1, chunk = 0, slice = 0;
  int peer = -1;  ///< SEND/RECV
  int tag = 0;    ///< collectives: bucket
  std::optional<ir::Stream> stream;  ///< from an "@stream" suffix; unset: the kind's default

  /// The stream the op runs on: its "@stream", else its kind's default.
  int stream_or_default() const { return static_cast<int>(stream ? *stream : ir::default_stream(kind)); }
};

/// Parses "F3", "BW0.c1:s2", "OPT", "SEND(F0.c1>r1)", "RECV(B3<r2)", "ALLREDUCE(b0)",
/// with an optional "@stream" suffix (the grammar of ir/plan_io.hpp). nullopt when
/// the name is not an op's text form.
std::optional<ParsedOpName> parse_op_name(std::string_view name);

/// Sets an event's op fields (kind, mb, chunk, slice, peer) from its parsed name.
void set_op_fields(TraceEvent& event, const ParsedOpName& op);

/// One op of a range name: its text and its fields.
struct NamedOp {
  std::string name;
  ParsedOpName op;
};
/// A profiler range named after one op ("F3") or after a batch of ops joined by '+'
/// ("SEND(F1>r1)+RECV(B0<r1)", as tdpipe prints a batched p2p group): its ops, or
/// empty when any part is not an op's text form.
std::vector<NamedOp> parse_op_group(std::string_view name);

}  // namespace tdpipe::traces
