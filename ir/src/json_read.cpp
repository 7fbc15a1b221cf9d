// json_read.cpp — strict JSON parsing: nlohmann's SAX parser into its DOM builder, with
// tdpipe's depth and duplicate-key checks.
#include "tdpipe/ir/json_read.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::ir {
namespace {

using nlohmann::json;

/// A container the parser has open: an object (its keys so far, the one being read) or
/// an array.
struct Level {
  bool is_object = false;
  std::string key;
  std::set<std::string> keys;
};

/// The members leading to (and including) open[0 … upto): "scenario.model", "[]", or
/// "top level".
std::string path_of(const std::vector<Level>& open, std::size_t upto) {
  std::string out;
  for (std::size_t d = 0; d < upto && d < open.size(); ++d) {
    if (open[d].is_object)
      out += (out.empty() ? "" : ".") + open[d].key;
    else
      out += "[]";
  }
  return out.empty() ? "top level" : out;
}

/// nlohmann's DOM builder with tdpipe's checks (depth, duplicate keys) on the way in.
/// (json::parse with a callback does the same checks but rescans an array's elements at
/// every object it closes — quadratic in a trace's event count; this is linear.)
class StrictSax {
 public:
  StrictSax(json& root, const std::string& source) : dom_(root, true), source_(source) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) { return dom_.number_float(v, s); }
  bool string(json::string_t& v) { return dom_.string(v); }
  bool binary(json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    open_container(true);
    return dom_.start_object(n);
  }
  bool key(json::string_t& name) {
    Level& level = open_.back();
    if (!level.keys.insert(name).second)
      throw Error(fmt::format("{}: {}: key \"{}\" given twice; expected each key once", source_,
                              path_of(open_, open_.size() - 1), name.size() > 60 ? name.substr(0, 60) + "…" : name));
    level.key = name;
    return dom_.key(name);
  }
  bool end_object() {
    open_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    open_container(false);
    return dom_.start_array(n);
  }
  bool end_array() {
    open_.pop_back();
    return dom_.end_array();
  }
  // (A template, as the DOM builder's: it throws the exception's own type, parse_error or
  // out_of_range, which parse_json catches.)
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& last_token, const Exception& ex) {
    return dom_.parse_error(position, last_token, ex);
  }

 private:
  void open_container(bool is_object) {
    if (open_.size() >= static_cast<std::size_t>(kMaxJsonDepth))
      throw Error(fmt::format("{}: nested deeper than {} levels (at {}); expected a tdpipe file, "
                              "which nests at most a few levels",
                              source_, kMaxJsonDepth, path_of(open_, open_.size())));
    open_.push_back(Level{is_object, {}, {}});
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  const std::string& source_;
  std::vector<Level> open_;
};

}  // namespace

json parse_json(std::string_view text, const std::string& source) {
  json root;
  StrictSax sax(root, source);
  try {
    json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", source, e.what()));
  } catch (const json::out_of_range& e) {  // a number past double's range, e.g. 1e400
    throw Error(fmt::format("{}: not valid JSON for tdpipe: {}", source, e.what()));
  }
  return root;
}

std::string read_file(const std::string& path, std::string_view what) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error(fmt::format("cannot read {} '{}': no such file", what, path));
  if (!std::filesystem::is_regular_file(path, ec))
    throw Error(fmt::format("cannot read {} '{}': not a regular file", what, path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(errno)));
  return std::move(text).str();
}

std::string quote_json(const json& v) {
  // A short flat container is quoted whole ([0], {"a":1}); others only by their size, so
  // a message never copies (or recurses through) a large value.
  if (v.is_structured()) {
    const bool flat = v.size() <= 8 && std::all_of(v.begin(), v.end(), [](const json& e) {
                        return e.is_primitive() && (!e.is_string() || e.get_ref<const std::string&>().size() <= 20);
                      });
    if (flat) return v.dump(-1, ' ', false, json::error_handler_t::replace);
    return v.is_array() ? fmt::format("an array of {} values", v.size())
                        : fmt::format("an object of {} keys", v.size());
  }
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s.size() > 60)
      return json(s.substr(0, 60)).dump(-1, ' ', false, json::error_handler_t::replace) + "…";
  }
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace tdpipe::ir
