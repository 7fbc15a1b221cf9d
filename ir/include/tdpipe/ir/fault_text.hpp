// fault_text.hpp — the text form of injected faults, shared by `tdpipe exec --inject`
// and `tdpipe sim --inject`: "kind:key=value,key=value,…". Each command knows its own
// kinds and what the keys mean; this splits the text and checks it against the kind's
// keys, so both give the same errors.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tdpipe::ir {

/// One kind's keys: every key it takes, and those it needs.
struct FaultKeys {
  std::set<std::string, std::less<>> allowed, required;
};

struct FaultText {
  std::string text;  ///< the whole spec, as given
  std::string kind;
  std::vector<std::pair<std::string, std::string>> keys;  ///< in the order given
};

/// Splits "kind:key=value,…". Throws tdpipe::Error, starting `--inject "TEXT": `, for
/// an unknown kind, an item that is not key=value, a key the kind does not take, a key
/// given twice or a required key missing; `help` (the accepted forms) ends each message.
FaultText parse_fault_text(std::string_view text, const std::map<std::string, FaultKeys, std::less<>>& kinds,
                           std::string_view help);

/// An integer value in [lo, hi]; the error names the spec and the key.
int fault_int(const FaultText& spec, std::string_view key, std::string_view value, int lo, int hi);

/// A finite number in (lo, hi] (open below when lo_open, else closed); `what` says
/// what it means in the error ("how many times slower").
double fault_number(const FaultText& spec, std::string_view key, std::string_view value, double lo,
                    bool lo_open, double hi, std::string_view what);

/// A time: a number with an optional unit ms, s (the default), min or h, ≥ 0 and at
/// most 10⁹ s; returned in seconds.
double fault_seconds(const FaultText& spec, std::string_view key, std::string_view value);

}  // namespace tdpipe::ir
