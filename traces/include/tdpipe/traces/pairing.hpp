// pairing.hpp — which measured op is the same op as which predicted op.
//
// Events are matched on (rank, name) — a tdpipe event's name is its op's text form,
// the same in predicted and measured traces; nameless events on (rank, kind,
// micro-batch, chunk, slice, peer), or (rank, stream) for foreign ones. The n-th
// occurrence of a key in start order on one side is paired with the n-th on the other
// side. `tdpipe compare` (traces::compare) and the viewer pair ops through this.
#pragma once

#include <vector>

#include "tdpipe/traces/trace.hpp"

namespace tdpipe::traces {

struct OpPairing {
  std::vector<int> pred_to_meas;  ///< per predicted event: measured index, or -1
  std::vector<int> meas_to_pred;  ///< per measured event: predicted index, or -1
  int pairs = 0;                  ///< number of matched pairs
};

/// Pairs the events of two timelines of the same schedule.
OpPairing pair_ops(const Trace& predicted, const Trace& measured);

}  // namespace tdpipe::traces
