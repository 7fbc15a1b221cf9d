// pairing.hpp — which measured op is the same op as which predicted op.
//
// Events are matched on (rank, name) like `tdpipe compare` (a tdpipe event's name is
// its op's text form); nameless events on (rank, kind, micro-batch, chunk, slice,
// peer). The n-th occurrence of a key in start order on one side is paired with the
// n-th on the other side.
#pragma once

#include <vector>

#include "tdpipe/traces/trace.hpp"

namespace tdpipe::viz {

struct OpPairing {
  std::vector<int> pred_to_meas;  ///< per predicted event: measured index, or -1
  std::vector<int> meas_to_pred;  ///< per measured event: predicted index, or -1
  int pairs = 0;                  ///< number of matched pairs
};

/// Pairs the events of two timelines of the same schedule.
OpPairing pair_ops(const traces::Trace& predicted, const traces::Trace& measured);

}  // namespace tdpipe::viz
