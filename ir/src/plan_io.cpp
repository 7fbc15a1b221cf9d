// plan_io.cpp — the plan's text form (one line per rank) and its JSON.
//
// Text grammar (whitespace separates op groups, `+` joins the ops of one batch):
//   header  := '#' 'schedule=' NAME ' p=' INT ' m=' INT ' v=' INT ' S=' INT ' d=' INT
//              [' lowered=1'] [' slice_tokens=' JSON-ARRAY] [' stage_of=' JSON-ARRAY]
//   line    := 'rank' INT ':' (' ' group)*            (a later '#' starts a comment)
//   group   := op ('+' op)*
//   op      := core ['@' STREAM]                       (only when not the kind's default)
//   core    := KIND ids                                F0.c1:s2, BW3, OPT
//            | SEND '(' KIND ids '>r' INT ')'           payload and producer ids, peer
//            | RECV '(' KIND ids '<r' INT ')'
//            | COLLECTIVE '(b' INT ['.c' INT] [':s' INT] ')'   bucket (tag)
//   ids     := [INT] ['.c' INT] [':s' INT]              mb (absent: -1), chunk, slice (absent: 0)
// The header is written first by to_text; when parsing, missing header fields are
// inferred (p = rank lines, m/v/S from the largest ids, d = 1, lowered = any comm op,
// stage_of = Megatron's c·p + r), so hand-written plans need no header. stage_of is
// printed only when it differs from that default. Batch ids are renumbered per rank
// on parsing (0, 1, …); bytes, tags of SEND/RECV, deps and costs live only in JSON.
#include "tdpipe/ir/plan_io.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/ir/scenario_io.hpp"

namespace tdpipe::ir {
namespace {

using nlohmann::json;

constexpr std::string_view kKindList =
    "F, B, W, BW, OPT, SEND, RECV, ALLREDUCE, REDUCE_SCATTER, ALL_GATHER, LOAD, OFFLOAD, CKPT, COMPRESSED_ALLREDUCE";

// What a plan file's counts may claim, checked before anything is sized by them (the
// default stage map is p·v entries, the validator's index p·v·m·S cells): a valid plan
// has an F for every (virtual stage, micro-batch, slice), so p·v·m·S beyond its ops —
// with room for the odd printable plan, valid or not, that the text form must carry — is
// refused (a header p = 10⁹ over three lines would otherwise allocate gigabytes).
void check_counts(const Plan& plan, const char* where) {
  long double ops = 0;
  for (const auto& r : plan.ranks) ops += static_cast<long double>(r.size());
  const long double triples = static_cast<long double>(std::max(plan.stages, 1)) * std::max(plan.chunks, 1) *
                              std::max(plan.microbatches, 1) * std::max(plan.slices, 1);
  constexpr long double kSlack = 1 << 20;
  if (triples > ops + kSlack)
    throw Error(fmt::format("{}: p·v·m·S = {}·{}·{}·{} forwards needed, but the plan has {} ops in all; expected "
                            "counts that match its ops",
                            where, plan.stages, plan.chunks, plan.microbatches, plan.slices,
                            static_cast<long long>(ops)));
}

std::vector<std::vector<int>> default_stage_of(int stages, int chunks) {
  std::vector<std::vector<int>> s(static_cast<std::size_t>(std::max(stages, 0)));
  for (int r = 0; r < stages; ++r)
    for (int c = 0; c < chunks; ++c) s[r].push_back(c * stages + r);
  return s;
}

// ---------------------------------------------------------------- text: printing

/// A char buffer of at least kOpTextMax chars with the three std::string appends the
/// printers use, so that op_to_chars formats one op without a heap string and
/// without a bounds check per char (one op's text always fits, see kOpTextMax).
struct CharSink {
  char* p;
  void append(const char* first, const char* last) {
    std::memcpy(p, first, static_cast<std::size_t>(last - first));
    p += last - first;
  }
  CharSink& operator+=(char ch) {
    *p++ = ch;
    return *this;
  }
  CharSink& operator+=(std::string_view sv) {
    append(sv.data(), sv.data() + sv.size());
    return *this;
  }
};

/// Appends an int in decimal; std::to_chars rather than fmt keeps op_to_text cheap
/// enough for the evaluator, which names every op of a plan.
template <typename Out>
void append_int(Out& out, int value) {
  char buf[16];
  const auto res = std::to_chars(buf, buf + sizeof buf, value);
  out.append(buf, res.ptr);
}

template <typename Out>
void append_ids(Out& out, int mb, int chunk, int slice) {
  if (mb != -1) append_int(out, mb);
  if (chunk != 0) {
    out += std::string_view(".c");
    append_int(out, chunk);
  }
  if (slice != 0) {
    out += std::string_view(":s");
    append_int(out, slice);
  }
}

template <typename Out>
void append_op(Out& out, const Op& op) {
  out += to_string(op.kind);
  if (is_p2p(op.kind)) {
    out += '(';
    out += to_string(op.payload);
    append_ids(out, op.mb, op.chunk, op.slice);
    out += op.kind == OpKind::SEND ? '>' : '<';
    out += 'r';
    append_int(out, op.peer);
    out += ')';
  } else if (is_collective(op.kind)) {
    out += std::string_view("(b");
    append_int(out, op.tag);
    append_ids(out, -1, op.chunk, op.slice);
    out += ')';
  } else {
    append_ids(out, op.mb, op.chunk, op.slice);
  }
  if (op.stream != default_stream(op.kind)) {
    out += '@';
    out += to_string(op.stream);
  }
}

/// A schedule name printed bare when it is one plain token, else as a JSON string.
std::string header_name(const std::string& name) {
  const bool plain = !name.empty() && name[0] != '[' &&
                     std::all_of(name.begin(), name.end(), [](char ch) {
                       return ch > ' ' && ch < 127 && ch != '"';
                     });
  return plain ? name : json(name).dump(-1, ' ', false, json::error_handler_t::replace);
}

// ---------------------------------------------------------------- text: parsing

class TextError {
 public:
  TextError(int line, std::string_view token) : line_(line), token_(token) {}
  [[noreturn]] void fail(std::string_view what) const {
    throw Error(fmt::format("plan text line {}, token '{}': expected {}", line_, token_, what));
  }

 private:
  int line_;
  std::string_view token_;
};

/// Reads one op token left to right.
class OpParser {
 public:
  OpParser(std::string_view s, const TextError& err) : s_(s), err_(err) {}

  Op parse() {
    Op op;
    op.kind = kind("an op kind (" + std::string(kKindList) + ")");
    if (is_p2p(op.kind)) {
      expect('(', fmt::format("'(' after {}, as in {}(F0>r1)", to_string(op.kind), to_string(op.kind)));
      op.payload = kind("the payload kind (F for an activation, B for a gradient)");
      ids(op);
      const char dir = op.kind == OpKind::SEND ? '>' : '<';
      expect(dir, fmt::format("'{}r<peer>' after the payload of {}", dir, to_string(op.kind)));
      expect('r', fmt::format("'r<peer>' after '{}'", dir));
      op.peer = integer("the peer rank after 'r'");
      expect(')', "')' after the peer rank");
    } else if (is_collective(op.kind)) {
      expect('(', fmt::format("'(b<bucket>)' after {}", to_string(op.kind)));
      expect('b', "'b<bucket>' inside the parentheses");
      op.tag = integer("the bucket number after 'b'");
      op.mb = -1;
      if (eat(".c")) op.chunk = integer("a chunk number after '.c'");
      if (eat(":s")) op.slice = integer("a slice number after ':s'");
      expect(')', "')' after the bucket");
    } else {
      ids(op);
    }
    op.stream = default_stream(op.kind);
    if (eat("@")) {
      const std::size_t start = i_;
      while (i_ < s_.size() && std::isalnum(static_cast<unsigned char>(s_[i_]))) ++i_;
      auto st = stream_from_string(s_.substr(start, i_ - start));
      if (!st) err_.fail("a stream after '@' (compute, p2p or dp)");
      op.stream = *st;
    }
    if (i_ != s_.size())
      err_.fail(fmt::format("the end of the op at '{}' (ids are written F<mb>.c<chunk>:s<slice>)",
                            s_.substr(i_)));
    return op;
  }

 private:
  bool eat(std::string_view lit) {
    if (s_.substr(i_, lit.size()) != lit) return false;
    i_ += lit.size();
    return true;
  }
  void expect(char ch, std::string_view what) {
    if (i_ >= s_.size() || s_[i_] != ch) err_.fail(what);
    ++i_;
  }
  OpKind kind(const std::string& what) {
    const std::size_t start = i_;
    while (i_ < s_.size() && ((s_[i_] >= 'A' && s_[i_] <= 'Z') || s_[i_] == '_')) ++i_;
    auto k = op_kind_from_string(s_.substr(start, i_ - start));
    if (!k) err_.fail(what);
    return *k;
  }
  bool at_int() const {
    return i_ < s_.size() &&
           (std::isdigit(static_cast<unsigned char>(s_[i_])) ||
            (s_[i_] == '-' && i_ + 1 < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_ + 1]))));
  }
  int integer(std::string_view what) {
    if (!at_int()) err_.fail(what);
    int v = 0;
    auto [ptr, ec] = std::from_chars(s_.data() + i_, s_.data() + s_.size(), v);
    if (ec != std::errc()) err_.fail(fmt::format("{} (in the range of int)", what));
    i_ = static_cast<std::size_t>(ptr - s_.data());
    return v;
  }
  void ids(Op& op) {
    op.mb = at_int() ? integer("a micro-batch number") : -1;
    if (eat(".c")) op.chunk = integer("a chunk number after '.c'");
    if (eat(":s")) op.slice = integer("a slice number after ':s'");
  }

  std::string_view s_;
  std::size_t i_ = 0;
  const TextError& err_;
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// ---------------------------------------------------------------- JSON helpers

class JsonField {
 public:
  JsonField(const json& j, std::string path) : j_(j), path_(std::move(path)) {}
  [[noreturn]] void fail(std::string_view what) const {
    throw Error(fmt::format("{}: expected {}, got {}", path_, what, quote_json(j_)));
  }
  long long integer(long long min, long long max) const {
    if (j_.is_number_unsigned()) {
      if (j_.get<unsigned long long>() > static_cast<unsigned long long>(max))
        fail(fmt::format("an integer in [{}, {}]", min, max));
      return static_cast<long long>(j_.get<unsigned long long>());
    }
    if (!j_.is_number_integer() || j_.get<long long>() < min || j_.get<long long>() > max)
      fail(fmt::format("an integer in [{}, {}]", min, max));
    return j_.get<long long>();
  }
  int int32() const {
    return static_cast<int>(integer(std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
  }
  double number() const {
    if (!j_.is_number()) fail("a number");
    return j_.get<double>();
  }
  const json& j() const { return j_; }
  const std::string& path() const { return path_; }

 private:
  const json& j_;
  std::string path_;
};

/// An object's fields by name; rejects unknown keys so typos do not pass silently.
class JsonObject {
 public:
  JsonObject(const json& j, std::string path, std::initializer_list<std::string_view> known)
      : j_(j), path_(std::move(path)) {
    if (!j.is_object()) JsonField(j, path_).fail("an object");
    for (const auto& [key, value] : j.items())
      if (std::find(known.begin(), known.end(), key) == known.end())
        throw Error(fmt::format("{}.{}: unknown key; expected one of {}", path_, key, fmt::join(known, ", ")));
  }
  bool has(const char* key) const { return j_.contains(key); }
  JsonField operator[](const char* key) const { return {j_.at(key), path_ + "." + key}; }
  const std::string& path() const { return path_; }

 private:
  const json& j_;
  std::string path_;
};

std::vector<int> int_list(const JsonField& f) {
  if (!f.j().is_array()) f.fail("a list of integers");
  std::vector<int> out;
  out.reserve(f.j().size());
  for (std::size_t i = 0; i < f.j().size(); ++i)
    out.push_back(JsonField(f.j()[i], fmt::format("{}[{}]", f.path(), i)).int32());
  return out;
}

struct Header {
  std::optional<std::string> schedule;
  std::optional<int> p, m, v, S, d;
  std::optional<bool> lowered;
  std::optional<std::vector<int>> slice_tokens, stage_layers;
  std::optional<std::vector<std::vector<int>>> stage_of;
};

/// Parses `schedule=… p=… …` (the text after '#').
Header parse_header(std::string_view s, int line) {
  Header h;
  std::size_t i = 0;
  auto skip_ws = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  };
  skip_ws();
  while (i < s.size()) {
    const std::size_t eq = s.find('=', i);
    const std::size_t ws = s.find_first_of(" \t", i);
    if (eq == std::string_view::npos || (ws != std::string_view::npos && ws < eq))
      TextError(line, s.substr(i, ws == std::string_view::npos ? s.npos : ws - i))
          .fail("key=value in the plan header (schedule, p, m, v, S, d, lowered, slice_tokens, stage_layers, "
                "stage_of)");
    const std::string_view key = s.substr(i, eq - i);
    std::size_t j = eq + 1;
    if (j < s.size() && s[j] == '"') {  // JSON string: up to the closing unescaped quote
      ++j;
      while (j < s.size() && s[j] != '"') j += s[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, s.size());
    } else if (j < s.size() && s[j] == '[') {  // JSON array of ints: to the matching bracket
      int depth = 0;
      for (; j < s.size(); ++j) {
        depth += s[j] == '[' ? 1 : s[j] == ']' ? -1 : 0;
        if (depth == 0) break;
      }
      j = std::min(j + 1, s.size());
    } else {
      while (j < s.size() && s[j] != ' ' && s[j] != '\t') ++j;
    }
    const std::string_view value = s.substr(eq + 1, j - eq - 1);
    const std::string_view token = s.substr(i, j - i);
    const TextError err(line, token);
    auto as_int = [&](std::optional<int>& out, int min) {
      int v = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || ptr != value.data() + value.size() || value.empty() || v < min)
        err.fail(fmt::format("an integer ≥ {} after '{}='", min, key));
      if (out) err.fail(fmt::format("'{}' only once in the header", key));
      out = v;
    };
    auto as_json = [&]() -> json {
      try {
        return parse_json(value, "plan text header");
      } catch (const Error&) {
        err.fail(fmt::format("valid JSON after '{}='", key));
      }
    };
    if (key == "schedule") {
      if (h.schedule) err.fail("'schedule' only once in the header");
      if (!value.empty() && value[0] == '"') {
        json j = as_json();
        if (!j.is_string()) err.fail("a quoted schedule name");
        h.schedule = j.get<std::string>();
      } else {
        h.schedule = std::string(value);
      }
    } else if (key == "p") {
      as_int(h.p, 0);
    } else if (key == "m") {
      as_int(h.m, 0);
    } else if (key == "v") {
      as_int(h.v, 1);
    } else if (key == "S") {
      as_int(h.S, 1);
    } else if (key == "d") {
      as_int(h.d, 1);
    } else if (key == "lowered") {
      if (value != "0" && value != "1") err.fail("lowered=0 or lowered=1");
      h.lowered = value == "1";
    } else if (key == "slice_tokens" || key == "stage_layers" || key == "stage_of") {
      const json j = as_json();
      try {  // strict: 1.5 or 1e12 are errors, not silently converted
        if (key == "slice_tokens") {
          h.slice_tokens = int_list(JsonField(j, "slice_tokens"));
        } else if (key == "stage_layers") {
          h.stage_layers = int_list(JsonField(j, "stage_layers"));
        } else {
          if (!j.is_array()) throw Error("not a list");
          std::vector<std::vector<int>> rows;
          for (const auto& row : j) rows.push_back(int_list(JsonField(row, "stage_of")));
          h.stage_of = std::move(rows);
        }
      } catch (const Error&) {
        err.fail(key == "slice_tokens"   ? "a JSON list of integers, e.g. slice_tokens=[1024,512,512]"
                 : key == "stage_layers" ? "a JSON list of integers, e.g. stage_layers=[7,8,8,7]"
                                         : "a JSON list of lists of integers, e.g. stage_of=[[0,7],[1,6]]");
      }
    } else {
      err.fail("a header key: schedule, p, m, v, S, d, lowered, slice_tokens, stage_layers or stage_of");
    }
    i = j;
    skip_ws();
  }
  return h;
}

json op_to_json(const Op& op) {
  // Filled key by key: nlohmann's initializer lists deep-copy every element, which
  // made plans of half a million ops several times slower to convert.
  json o = json::object();
  o["kind"] = to_string(op.kind);
  o["mb"] = op.mb;
  o["chunk"] = op.chunk;
  o["slice"] = op.slice;
  o["payload"] = to_string(op.payload);
  o["peer"] = op.peer;
  o["bytes"] = op.bytes;
  o["tag"] = op.tag;
  o["batch"] = op.batch;
  if (op.ready_after != 1.0f) o["ready_after"] = op.ready_after;
  o["stream"] = to_string(op.stream);
  json& deps = o["deps"] = json::array();
  for (const auto& d : op.deps) {
    json pair = json::array();
    pair.push_back(d.rank);
    pair.push_back(d.index);
    deps.push_back(std::move(pair));
  }
  o["flops"] = op.flops;
  o["mem_bytes"] = op.mem_bytes;
  o["est_seconds"] = op.est_seconds;
  return o;
}

OpKind kind_field(const JsonField& f) {
  if (!f.j().is_string()) f.fail(fmt::format("an op kind ({})", kKindList));
  auto k = op_kind_from_string(f.j().get<std::string>());
  if (!k) f.fail(fmt::format("an op kind ({})", kKindList));
  return *k;
}

Op op_from_json(const json& j, const std::string& path) {
  const JsonObject o(j, path,
                     {"kind", "mb", "chunk", "slice", "payload", "peer", "bytes", "tag", "batch",
                      "ready_after", "stream", "deps", "flops", "mem_bytes", "est_seconds"});
  Op op;
  if (!o.has("kind")) throw Error(fmt::format("{}.kind: missing; expected an op kind ({})", path, kKindList));
  op.kind = kind_field(o["kind"]);
  op.stream = default_stream(op.kind);
  if (o.has("mb")) op.mb = o["mb"].int32();
  if (o.has("chunk")) op.chunk = o["chunk"].int32();
  if (o.has("slice")) op.slice = o["slice"].int32();
  if (o.has("payload")) op.payload = kind_field(o["payload"]);
  if (o.has("peer")) op.peer = o["peer"].int32();
  if (o.has("bytes"))
    op.bytes = o["bytes"].integer(std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max());
  if (o.has("tag")) op.tag = o["tag"].int32();
  if (o.has("batch")) op.batch = o["batch"].int32();
  if (o.has("ready_after")) {
    const JsonField f = o["ready_after"];
    const double v = f.number();
    if (!(v >= 0 && v <= 1)) f.fail("a fraction from 0 to 1 (of the first dependency's run)");
    op.ready_after = static_cast<float>(v);
  }
  if (o.has("stream")) {
    const JsonField f = o["stream"];
    auto st = f.j().is_string() ? stream_from_string(f.j().get<std::string>()) : std::nullopt;
    if (!st) f.fail("a stream (compute, p2p or dp)");
    op.stream = *st;
  }
  if (o.has("deps")) {
    const JsonField f = o["deps"];
    if (!f.j().is_array()) f.fail("a list of [rank, index] pairs");
    for (std::size_t i = 0; i < f.j().size(); ++i) {
      const JsonField d(f.j()[i], fmt::format("{}[{}]", f.path(), i));
      if (!d.j().is_array() || d.j().size() != 2) d.fail("a [rank, index] pair");
      op.deps.push_back({JsonField(d.j()[0], d.path() + "[0]").int32(),
                         JsonField(d.j()[1], d.path() + "[1]").int32()});
    }
  }
  if (o.has("flops")) op.flops = o["flops"].number();
  if (o.has("mem_bytes")) op.mem_bytes = o["mem_bytes"].number();
  if (o.has("est_seconds")) op.est_seconds = o["est_seconds"].number();
  return op;
}

/// Fills what a header or JSON object left out, from the ops themselves.
struct Inferred {
  int m = 0, v = 1, S = 1;
  bool comm = false;
};

Inferred infer(const Plan& plan) {
  Inferred in;
  for (const auto& rank : plan.ranks)
    for (const Op& op : rank) {
      if (is_p2p(op.kind) || is_collective(op.kind)) in.comm = true;
      if (op.kind == OpKind::OPT || is_collective(op.kind)) continue;
      in.m = std::max(in.m, op.mb + 1);
      in.v = std::max(in.v, op.chunk + 1);
      in.S = std::max(in.S, op.slice + 1);
    }
  return in;
}

}  // namespace

std::string op_to_text(const Op& op) {
  std::string out;
  append_op(out, op);
  return out;
}

std::size_t op_to_chars(const Op& op, char* out, std::size_t capacity) {
  if (capacity >= kOpTextMax) {
    CharSink sink{out};
    append_op(sink, op);
    return static_cast<std::size_t>(sink.p - out);
  }
  // A short buffer gets the prefix that fits.
  char full[kOpTextMax];
  CharSink sink{full};
  append_op(sink, op);
  const std::size_t n = std::min(capacity, static_cast<std::size_t>(sink.p - full));
  std::memcpy(out, full, n);
  return n;
}

std::string to_text(const Plan& plan) {
  std::string out;
  out.reserve(64 + 8 * static_cast<std::size_t>(std::max(plan.stages, 1)) *
                       std::max(plan.microbatches, 1) * std::max(plan.chunks, 1) * 3);
  fmt::format_to(std::back_inserter(out), "# schedule={} p={} m={} v={} S={} d={}", header_name(plan.schedule),
                 plan.stages, plan.microbatches, plan.chunks, plan.slices, plan.data);
  if (plan.lowered) out += " lowered=1";
  if (!plan.slice_tokens.empty()) out += " slice_tokens=" + json(plan.slice_tokens).dump();
  if (!plan.stage_layers.empty()) out += " stage_layers=" + json(plan.stage_layers).dump();
  if (plan.stage_of != default_stage_of(plan.stages, plan.chunks))
    out += " stage_of=" + json(plan.stage_of).dump();
  out += '\n';
  for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
    fmt::format_to(std::back_inserter(out), "rank{}:", r);
    const auto& ops = plan.ranks[r];
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const bool joined = i > 0 && ops[i].batch != -1 && ops[i].batch == ops[i - 1].batch;
      out += joined ? '+' : ' ';
      append_op(out, ops[i]);
    }
    out += '\n';
  }
  return out;
}

Plan plan_from_text(std::string_view text) {
  Plan plan;
  std::optional<Header> header;
  int line_no = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    line = trim(line);
    if (line.empty()) continue;
    if (line[0] == '#') {
      const std::string_view rest = trim(line.substr(1));
      if (rest.substr(0, 9) == "schedule=") {
        if (header) TextError(line_no, rest).fail("one plan header only");
        if (!plan.ranks.empty()) TextError(line_no, rest).fail("the plan header before the first rank line");
        header = parse_header(rest, line_no);
      }
      continue;  // any other '#' line is a comment
    }
    if (const std::size_t hash = line.find('#'); hash != std::string_view::npos) line = trim(line.substr(0, hash));
    const std::size_t colon = line.find(':');
    const std::string_view label = line.substr(0, colon);
    const TextError label_err(line_no, label);
    if (colon == std::string_view::npos || label.substr(0, 4) != "rank")
      label_err.fail(fmt::format("'rank{}:' at the start of the line", plan.ranks.size()));
    int rank = -1;
    const std::string_view num = label.substr(4);
    auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), rank);
    if (ec != std::errc() || ptr != num.data() + num.size() || num.empty() ||
        rank != static_cast<int>(plan.ranks.size()))
      label_err.fail(fmt::format("'rank{}:' (rank lines in order from rank0)", plan.ranks.size()));
    auto& ops = plan.ranks.emplace_back();
    int next_batch = 0;
    std::string_view rest = line.substr(colon + 1);
    while (true) {
      rest = trim(rest);
      if (rest.empty()) break;
      const std::size_t end = rest.find_first_of(" \t");
      const std::string_view group = rest.substr(0, end);
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
      const bool batched = group.find('+') != std::string_view::npos;
      std::size_t start = 0;
      while (true) {
        const std::size_t plus = group.find('+', start);
        const std::string_view token = group.substr(start, plus == std::string_view::npos ? group.npos : plus - start);
        if (token.empty()) TextError(line_no, group).fail("an op on each side of '+'");
        Op op = OpParser(token, TextError(line_no, token)).parse();
        if (batched) op.batch = next_batch;
        ops.push_back(std::move(op));
        if (plus == std::string_view::npos) break;
        start = plus + 1;
      }
      if (batched) ++next_batch;
    }
  }
  const Header h = header.value_or(Header{});
  const Inferred in = infer(plan);
  plan.schedule = h.schedule.value_or("");
  plan.stages = h.p.value_or(plan.num_ranks());
  plan.microbatches = h.m.value_or(in.m);
  plan.chunks = h.v.value_or(in.v);
  plan.slices = h.S.value_or(in.S);
  plan.data = h.d.value_or(1);
  plan.lowered = h.lowered.value_or(header ? false : in.comm);
  plan.slice_tokens = h.slice_tokens.value_or(std::vector<int>{});
  plan.stage_layers = h.stage_layers.value_or(std::vector<int>{});
  if (!plan.stage_layers.empty() &&
      static_cast<long long>(plan.stage_layers.size()) != static_cast<long long>(plan.stages) * plan.chunks)
    throw Error(fmt::format("plan text header: stage_layers has {} entries; expected one per virtual stage "
                            "(p*v = {}*{})", plan.stage_layers.size(), plan.stages, plan.chunks));
  for (int n : plan.stage_layers)
    if (n < 0) throw Error(fmt::format("plan text header: stage_layers has a stage of {} layers; expected ≥ 0", n));
  check_counts(plan, "plan text header");
  plan.stage_of = h.stage_of ? *h.stage_of : default_stage_of(plan.stages, plan.chunks);
  return plan;
}

nlohmann::json to_json(const Plan& plan) {
  json ranks = json::array();
  for (const auto& rank : plan.ranks) {
    json ops = json::array();
    for (const Op& op : rank) ops.push_back(op_to_json(op));
    ranks.push_back(std::move(ops));
  }
  return {{"schedule", plan.schedule},
          {"stages", plan.stages},
          {"microbatches", plan.microbatches},
          {"chunks", plan.chunks},
          {"slices", plan.slices},
          {"data", plan.data},
          {"lowered", plan.lowered},
          {"stage_of", plan.stage_of},
          {"slice_tokens", plan.slice_tokens},
          {"stage_layers", plan.stage_layers},
          {"memory_budget_bytes", plan.memory_budget_bytes},
          {"ranks", std::move(ranks)},
          {"scenario", to_json(plan.scenario)},
          {"serve", plan.serve ? to_json(*plan.serve) : json(nullptr)}};
}

Plan plan_from_json(const nlohmann::json& j) {
  const JsonObject o(j, "plan",
                     {"schedule", "stages", "microbatches", "chunks", "slices", "data", "lowered",
                      "stage_of", "slice_tokens", "stage_layers", "memory_budget_bytes", "ranks", "scenario", "serve"});
  Plan plan;
  if (!o.has("ranks")) throw Error("plan.ranks: missing; expected a list of op lists, one per rank");
  const JsonField ranks = o["ranks"];
  if (!ranks.j().is_array()) ranks.fail("a list of op lists, one per rank");
  for (std::size_t r = 0; r < ranks.j().size(); ++r) {
    const JsonField rank(ranks.j()[r], fmt::format("plan.ranks[{}]", r));
    if (!rank.j().is_array()) rank.fail("a list of ops");
    auto& ops = plan.ranks.emplace_back();
    ops.reserve(rank.j().size());
    for (std::size_t i = 0; i < rank.j().size(); ++i)
      ops.push_back(op_from_json(rank.j()[i], fmt::format("plan.ranks[{}][{}]", r, i)));
  }
  const Inferred in = infer(plan);
  if (o.has("schedule")) {
    const JsonField f = o["schedule"];
    if (!f.j().is_string()) f.fail("a string");
    plan.schedule = f.j().get<std::string>();
  }
  plan.stages = o.has("stages") ? static_cast<int>(o["stages"].integer(0, std::numeric_limits<int>::max()))
                                : plan.num_ranks();
  plan.microbatches =
      o.has("microbatches") ? static_cast<int>(o["microbatches"].integer(0, std::numeric_limits<int>::max())) : in.m;
  plan.chunks = o.has("chunks") ? static_cast<int>(o["chunks"].integer(1, std::numeric_limits<int>::max())) : in.v;
  plan.slices = o.has("slices") ? static_cast<int>(o["slices"].integer(1, std::numeric_limits<int>::max())) : in.S;
  plan.data = o.has("data") ? static_cast<int>(o["data"].integer(1, std::numeric_limits<int>::max())) : 1;
  if (o.has("lowered")) {
    const JsonField f = o["lowered"];
    if (!f.j().is_boolean()) f.fail("true or false");
    plan.lowered = f.j().get<bool>();
  } else {
    plan.lowered = in.comm;
  }
  check_counts(plan, "plan");
  if (o.has("stage_of")) {
    const JsonField f = o["stage_of"];
    if (!f.j().is_array()) f.fail("a list (per rank) of lists (per chunk) of virtual stages");
    for (std::size_t r = 0; r < f.j().size(); ++r)
      plan.stage_of.push_back(int_list(JsonField(f.j()[r], fmt::format("plan.stage_of[{}]", r))));
  } else {
    plan.stage_of = default_stage_of(plan.stages, plan.chunks);
  }
  if (o.has("slice_tokens")) plan.slice_tokens = int_list(o["slice_tokens"]);
  if (o.has("stage_layers")) {
    const JsonField f = o["stage_layers"];
    plan.stage_layers = int_list(f);
    if (!plan.stage_layers.empty() && static_cast<long long>(plan.stage_layers.size()) !=
                                          static_cast<long long>(plan.stages) * plan.chunks)
      f.fail(fmt::format("one layer count per virtual stage (stages*chunks = {}*{} = {} entries)", plan.stages,
                         plan.chunks, static_cast<long long>(plan.stages) * plan.chunks));
    for (int n : plan.stage_layers)
      if (n < 0) f.fail("layer counts ≥ 0");
  }
  if (o.has("memory_budget_bytes")) {
    const JsonField f = o["memory_budget_bytes"];
    if (!f.j().is_array()) f.fail("a list of bytes, one per rank");
    for (std::size_t r = 0; r < f.j().size(); ++r) {
      const double b = JsonField(f.j()[r], fmt::format("plan.memory_budget_bytes[{}]", r)).number();
      if (!(b >= 0) || !std::isfinite(b))
        JsonField(f.j()[r], fmt::format("plan.memory_budget_bytes[{}]", r)).fail("a finite number of bytes ≥ 0");
      plan.memory_budget_bytes.push_back(b);
    }
  }
  if (o.has("serve") && !j.at("serve").is_null()) plan.serve = serve_from_json(j.at("serve"), "plan.serve");
  if (o.has("scenario")) {
    try {
      plan.scenario = scenario_from_json(j.at("scenario"));
    } catch (const Error& e) {
      throw Error(fmt::format("plan.{}", e.what()));  // scenario paths start with "scenario"
    }
    long long sum = 0;
    for (int n : plan.stage_layers) sum += n;
    if (!plan.stage_layers.empty() && !plan.scenario.synthetic && sum != plan.scenario.model.layers)
      throw Error(fmt::format("plan.stage_layers: the stages hold {} layers in all; expected the scenario's "
                              "model.layers = {}", sum, plan.scenario.model.layers));
  }
  return plan;
}

std::pair<int, int> layer_range(const std::vector<int>& partition, int layers, int stage, int stages) {
  if (stages < 1 || stage < 0 || stage >= stages)
    throw Error(fmt::format("layer_range: stage {} of {} is out of range", stage, stages));
  if (partition.empty()) {
    const int base = layers / stages, extra = layers % stages;
    auto start = [&](int s) { return s * base + std::max(0, s - (stages - extra)); };
    return {start(stage), start(stage + 1)};
  }
  long long sum = 0, first = 0;
  bool ok = static_cast<int>(partition.size()) == stages;
  for (std::size_t s = 0; ok && s < partition.size(); ++s) {
    ok = partition[s] >= 0;
    if (static_cast<int>(s) < stage) first += partition[s];
    sum += partition[s];
  }
  if (!ok || sum != layers)
    throw Error(fmt::format("stage_layers {}: expected {} layer counts ≥ 0 summing to the model's {} layers",
                            json(partition).dump(), stages, layers));
  return {static_cast<int>(first), static_cast<int>(first + partition[static_cast<std::size_t>(stage)])};
}

}  // namespace tdpipe::ir
