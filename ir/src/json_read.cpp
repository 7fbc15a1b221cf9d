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
/// an array (how many elements so far), and the value it builds.
struct Level {
  bool is_object = false;
  std::string key;
  std::set<std::string> keys;
  std::size_t count = 0;
  json* value = nullptr;
};

/// The members leading to (and including) open[0 … upto): "scenario.model", "x[3]", or
/// "top level".
std::string path_of(const std::vector<Level>& open, std::size_t upto) {
  std::string out;
  for (std::size_t d = 0; d < upto && d < open.size(); ++d) {
    if (open[d].is_object)
      out += (out.empty() ? "" : ".") + open[d].key;
    else
      out += fmt::format("[{}]", open[d].count == 0 ? 0 : open[d].count - 1);
  }
  return out.empty() ? "top level" : out;
}

/// Builds the document from nlohmann's SAX events, with tdpipe's checks (depth, duplicate
/// keys) on the way in. (json::parse with a callback does the same checks but rescans an
/// array's elements at every object it closes — quadratic in a trace's event count; this
/// is linear. Pointers into open containers stay valid: only the innermost one grows.)
class StrictSax {
 public:
  StrictSax(json& root, const std::string& source) : root_(root), source_(source) {}

  bool null() { return add(nullptr), true; }
  bool boolean(bool v) { return add(v), true; }
  bool number_integer(json::number_integer_t v) { return add(v), true; }
  bool number_unsigned(json::number_unsigned_t v) { return add(v), true; }
  bool number_float(json::number_float_t v, const json::string_t&) { return add(v), true; }
  bool string(json::string_t& v) { return add(std::move(v)), true; }
  bool binary(json::binary_t& v) { return add(json::binary(std::move(v))), true; }
  bool start_object(std::size_t) {
    open_container(true, json::object());
    return true;
  }
  bool key(json::string_t& name) {
    Level& level = open_.back();
    if (!level.keys.insert(name).second)
      throw Error(fmt::format("{}: {}: key \"{}\" given twice; expected each key once", source_,
                              path_of(open_, open_.size() - 1), name.size() > 60 ? name.substr(0, 60) + "…" : name));
    level.key = name;
    return true;
  }
  bool end_object() {
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    open_container(false, json::array());
    return true;
  }
  bool end_array() {
    open_.pop_back();
    return true;
  }
  // Throws the parser's own exception (parse_error, out_of_range), which parse_json catches.
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& ex) {
    throw ex;
  }

 private:
  json* add(json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Level& level = open_.back();
    if (!level.is_object) {
      auto& array = level.value->get_ref<json::array_t&>();
      array.push_back(std::move(v));
      ++level.count;
      return &array.back();
    }
    auto& object = level.value->get_ref<json::object_t&>();
    return &(object[level.key] = std::move(v));
  }

  void open_container(bool is_object, json&& empty) {
    if (open_.size() >= static_cast<std::size_t>(kMaxJsonDepth))
      throw Error(fmt::format("{}: nested deeper than {} levels (at {}); expected a tdpipe file, "
                              "which nests at most a few levels",
                              source_, kMaxJsonDepth, path_of(open_, open_.size())));
    json* value = add(std::move(empty));
    open_.push_back(Level{is_object, {}, {}, 0, value});
  }

  json& root_;
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
