// json_read.cpp — strict JSON parsing through nlohmann's parser callback.
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

/// What the parser has open at each depth: an object's keys so far, or an array.
struct Level {
  bool is_object = false;
  std::string key;  ///< the key being read in this object
  std::set<std::string> keys;
};

std::string path_of(const std::vector<Level>& open, std::size_t upto) {
  std::string out;
  for (std::size_t d = 1; d < upto && d < open.size(); ++d) {
    if (open[d].is_object)
      out += (out.empty() ? "" : ".") + open[d].key;
    else
      out += "[]";
  }
  return out.empty() ? "top level" : out;
}

}  // namespace

json parse_json(std::string_view text, const std::string& source) {
  // open[d] describes the container whose members are at depth d (the callback's depth
  // for a key is the depth of the object holding it plus one).
  std::vector<Level> open(1);
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    const auto d = static_cast<std::size_t>(depth);
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth)
          throw Error(fmt::format("{}: nested deeper than {} levels (at {}); expected a tdpipe file, "
                                  "which nests at most a few levels",
                                  source, kMaxJsonDepth, path_of(open, d + 1)));
        open.resize(d + 2);
        open[d + 1] = Level{event == json::parse_event_t::object_start, {}, {}};
        break;
      case json::parse_event_t::key: {
        if (d >= open.size()) break;
        std::string name = parsed.get<std::string>();
        if (!open[d].keys.insert(name).second)
          throw Error(fmt::format("{}: {}: key \"{}\" given twice; expected each key once",
                                  source, path_of(open, d), name.size() > 60 ? name.substr(0, 60) + "…" : name));
        open[d].key = std::move(name);
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", source, e.what()));
  } catch (const json::out_of_range& e) {  // a number past double's range, e.g. 1e400
    throw Error(fmt::format("{}: not valid JSON for tdpipe: {}", source, e.what()));
  }
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
