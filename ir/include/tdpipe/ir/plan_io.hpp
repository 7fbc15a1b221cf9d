// plan_io.hpp — the plan's text form (one line per rank) and JSON.
//
// Text form: `rank0: F0 F1 BW0 …`; chunk `F0.c1`, slice `F0:s2`, both `F0.c1:s2`;
// OPT as `OPT`; lowered ops as `SEND(F0.c1:s2>r1)`, `RECV(B3<r2)`, `ALLREDUCE(b0)`;
// comm ops posted together are joined with `+` (`SEND(F0>r1)+RECV(B0<r1)`);
// a stream other than the kind's default is suffixed `@p2p` / `@dp` / `@compute`.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "tdpipe/ir/plan.hpp"

namespace tdpipe::ir {

/// One op in the text form, e.g. "F0.c1:s2".
std::string op_to_text(const Op& op);
/// The longest text form of one op (kind, payload, four ints, stream suffix) fits.
inline constexpr std::size_t kOpTextMax = 96;
/// op_to_text into `out` without allocating (callers naming millions of ops); writes
/// at most `capacity` chars, no terminator, and returns how many it wrote.
std::size_t op_to_chars(const Op& op, char* out, std::size_t capacity);
/// Whole plan, one line per rank.
std::string to_text(const Plan& plan);
/// Parses the text form; throws tdpipe::Error naming line and token on bad input.
/// Only the op order survives (costs, bytes, deps are not in the text form).
Plan plan_from_text(std::string_view text);

nlohmann::json to_json(const Plan& plan);
/// Throws tdpipe::Error naming the field on bad input.
Plan plan_from_json(const nlohmann::json& j);

}  // namespace tdpipe::ir
