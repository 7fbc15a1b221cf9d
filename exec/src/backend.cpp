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

}  // namespace tdpipe::exec
