// fault_text.cpp — "kind:key=value,…" split and checked (see fault_text.hpp).
#include "tdpipe/ir/fault_text.hpp"

#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::ir {

FaultText parse_fault_text(std::string_view text, const std::map<std::string, FaultKeys, std::less<>>& kinds,
                           std::string_view help) {
  FaultText f;
  f.text = std::string(text);
  const auto colon = text.find(':');
  f.kind = std::string(text.substr(0, colon));
  const auto k = kinds.find(f.kind);
  if (k == kinds.end())
    throw Error(fmt::format("--inject \"{}\": unknown fault kind \"{}\"; expected {}", text, f.kind, help));
  const FaultKeys& keys = k->second;
  std::set<std::string, std::less<>> seen;
  std::string_view rest = colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  if (!rest.empty() && rest.back() == ',')
    throw Error(fmt::format("--inject \"{}\": ends with a comma; expected {}", text, help));
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
      throw Error(fmt::format("--inject \"{}\": \"{}\" is not key=value; expected {}", text, item, help));
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (!keys.allowed.count(key))
      throw Error(fmt::format("--inject \"{}\": {} takes no key \"{}\"; expected {}", text, f.kind, key, help));
    if (!seen.insert(std::string(key)).second)
      throw Error(fmt::format("--inject \"{}\": key \"{}\" given twice", text, key));
    f.keys.emplace_back(std::string(key), std::string(value));
  }
  for (const auto& key : keys.required)
    if (!seen.count(key))
      throw Error(fmt::format("--inject \"{}\": {} needs {}=…; expected {}", text, f.kind, key, help));
  return f;
}

int fault_int(const FaultText& spec, std::string_view key, std::string_view value, int lo, int hi) {
  int v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < lo || v > hi)
    throw Error(fmt::format("--inject \"{}\": {}={} is not an integer in [{}, {}]", spec.text, key, value, lo, hi));
  return v;
}

namespace {
bool parse_double(std::string_view s, double& v) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() && std::isfinite(v);
}
}  // namespace

double fault_number(const FaultText& spec, std::string_view key, std::string_view value, double lo,
                    bool lo_open, double hi, std::string_view what) {
  double v = 0;
  if (!parse_double(value, v) || (lo_open ? !(v > lo) : !(v >= lo)) || !(v <= hi))
    throw Error(fmt::format("--inject \"{}\": {}={} is not a number in {}{}, {}] ({})", spec.text, key, value,
                            lo_open ? "(" : "[", lo, hi, what));
  return v;
}

double fault_seconds(const FaultText& spec, std::string_view key, std::string_view value) {
  static const std::pair<std::string_view, double> units[] = {{"ms", 1e-3}, {"min", 60}, {"s", 1}, {"h", 3600}};
  std::string_view number = value;
  double scale = 1;
  for (const auto& [unit, factor] : units) {
    if (value.size() > unit.size() && value.substr(value.size() - unit.size()) == unit) {
      number = value.substr(0, value.size() - unit.size());
      scale = factor;
      break;
    }
  }
  double v = 0;
  if (!parse_double(number, v) || !(v >= 0) || !(v * scale <= 1e9))
    throw Error(fmt::format("--inject \"{}\": {}={} is not a time ≥ 0 (a number of s, or with a unit ms, s, "
                            "min or h; at most 1e9 s)",
                            spec.text, key, value));
  return v * scale;
}

}  // namespace tdpipe::ir
