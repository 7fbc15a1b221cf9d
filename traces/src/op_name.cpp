// op_name.cpp — parser of one op's text form (see ir/plan_io.hpp for the grammar).
#include "tdpipe/traces/op_name.hpp"

#include <cctype>
#include <charconv>

namespace tdpipe::traces {
namespace {

// A cursor over the name; every reader consumes on success only.
struct Cursor {
  std::string_view s;
  bool eat(char c) {
    if (s.empty() || s.front() != c) return false;
    s.remove_prefix(1);
    return true;
  }
  bool eat(std::string_view w) {
    if (s.substr(0, w.size()) != w) return false;
    s.remove_prefix(w.size());
    return true;
  }
  bool number(int& out) {
    if (s.empty() || !std::isdigit(static_cast<unsigned char>(s.front()))) return false;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec != std::errc()) return false;
    s.remove_prefix(static_cast<std::size_t>(ptr - s.data()));
    return true;
  }
  // The longest run of [A-Z_] that names an op kind.
  bool kind(ir::OpKind& out) {
    std::size_t n = 0;
    while (n < s.size() && (std::isupper(static_cast<unsigned char>(s[n])) || s[n] == '_')) ++n;
    const auto k = ir::op_kind_from_string(s.substr(0, n));
    if (!k) return false;
    out = *k;
    s.remove_prefix(n);
    return true;
  }
  // [INT] ['.c' INT] [':s' INT]
  bool ids(ParsedOpName& op, bool allow_mb) {
    if (allow_mb) {
      int mb;
      if (number(mb)) op.mb = mb;
    }
    if (eat(".c") && !number(op.chunk)) return false;
    if (eat(":s") && !number(op.slice)) return false;
    return true;
  }
};

}  // namespace

std::optional<ParsedOpName> parse_op_name(std::string_view name) {
  ParsedOpName op;
  if (const auto at = name.rfind('@'); at != std::string_view::npos) {
    op.stream = ir::stream_from_string(name.substr(at + 1));
    if (!op.stream) return std::nullopt;
    name = name.substr(0, at);
  }
  Cursor c{name};
  if (!c.kind(op.kind)) return std::nullopt;
  if (ir::is_p2p(op.kind)) {
    if (!c.eat('(') || !c.kind(op.payload) || !c.ids(op, true)) return std::nullopt;
    if (!c.eat(op.kind == ir::OpKind::SEND ? ">r" : "<r") || !c.number(op.peer) || !c.eat(')'))
      return std::nullopt;
  } else if (ir::is_collective(op.kind)) {
    if (!c.eat("(b") || !c.number(op.tag) || !c.ids(op, false) || !c.eat(')')) return std::nullopt;
  } else if (!c.ids(op, true)) {
    return std::nullopt;
  }
  if (!c.s.empty()) return std::nullopt;
  return op;
}

void set_op_fields(TraceEvent& e, const ParsedOpName& op) {
  e.kind = op.kind;
  e.mb = op.mb;
  e.chunk = op.chunk;
  e.slice = op.slice;
  e.peer = op.peer;
}

std::vector<NamedOp> parse_op_group(std::string_view name) {
  std::vector<NamedOp> ops;
  while (true) {
    const auto plus = name.find('+');
    const std::string_view part = name.substr(0, plus);
    auto op = parse_op_name(part);
    if (!op) return {};
    ops.push_back({std::string(part), *op});
    if (plus == std::string_view::npos) return ops;
    name.remove_prefix(plus + 1);
  }
}

}  // namespace tdpipe::traces
