// trace_io.cpp — one entry point for reading any trace tdpipe knows, by its content:
// a folder is per-rank Kineto files; a file starting with SQLite's header is an Nsight
// Systems export; gzip data is decompressed first; JSON with Kineto's top-level keys
// (and no tdpipe Chrome marker) is Kineto; any other JSON is Chrome.
#include "tdpipe/traces/trace_io.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/kineto.hpp"
#include "tdpipe/traces/nsys.hpp"

namespace tdpipe::traces {
namespace {

// Decompressed traces stay under this (a profiler trace of one step is MiBs to a few
// hundred MiBs): a corrupt or hostile file gets an error, not an exhausted memory.
constexpr std::size_t kMaxInflated = std::size_t(4) << 30;

bool is_gzip(const std::string& data) {
  return data.size() >= 2 && static_cast<unsigned char>(data[0]) == 0x1f && static_cast<unsigned char>(data[1]) == 0x8b;
}

// Every gzip member in turn (as zcat reads them); anything else after a member is an error.
std::string gunzip(const std::string& data, const std::string& path) {
  if (data.size() > UINT32_MAX) throw Error(fmt::format("{}: gzip: a file over 4 GiB; expected a trace", path));
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw Error(fmt::format("{}: cannot start gzip decompression", path));
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  std::string out;
  char buf[1 << 16];
  auto fail = [&](const std::string& why) {
    inflateEnd(&z);
    throw Error(fmt::format("{}: gzip: {}", path, why));
  };
  for (;;) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    const int rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) fail(z.msg ? z.msg : "truncated or corrupt data");
    out.append(buf, sizeof buf - z.avail_out);
    if (out.size() > kMaxInflated)
      fail(fmt::format("decompresses to more than {} GiB; expected a trace", kMaxInflated >> 30));
    if (rc == Z_STREAM_END) {
      if (z.avail_in == 0) break;
      if (z.avail_in < 2 || z.next_in[0] != 0x1f || z.next_in[1] != 0x8b)
        fail(fmt::format("{} bytes after the end of the compressed data", z.avail_in));
      if (inflateReset(&z) != Z_OK) fail("cannot read the next member");
      continue;
    }
    if (z.avail_in == 0 && z.avail_out != 0) fail("truncated data");
  }
  inflateEnd(&z);
  return out;
}

// A file's text, decompressed when it is gzip data.
std::string read_text(const std::string& path) {
  std::string data = ir::read_file(path, "trace");
  return is_gzip(data) ? gunzip(data, path) : data;
}

bool is_tdpipe_chrome(const nlohmann::json& j) {
  if (!j.is_object()) return false;
  const auto o = j.find("otherData");
  if (o == j.end() || !o->is_object()) return false;
  const auto g = o->find("generator");
  return g != o->end() && g->is_string() && *g == "tdpipe";
}

// Each file parsed, its ops taken and its JSON dropped before the next is read.
Trace read_folder(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (it->is_regular_file(type_ec) && (name.ends_with(".json") || name.ends_with(".json.gz")))
      paths.push_back(it->path().string());
  }
  if (ec) throw Error(fmt::format("cannot read trace folder '{}': {}", dir, ec.message()));
  if (paths.empty())
    throw Error(fmt::format("trace folder '{}': no .json or .json.gz files (expected one Kineto trace per rank)", dir));
  std::sort(paths.begin(), paths.end());
  KinetoImport import(paths.size() == 1);
  for (const auto& p : paths) {
    const nlohmann::json j = ir::parse_json(read_text(p), p);
    if (!is_kineto_json(j) || is_tdpipe_chrome(j))
      throw Error(fmt::format("{}: not a Kineto trace (expected traceEvents beside schemaVersion or "
                              "distributedInfo); a trace folder holds one Kineto file per rank",
                              p));
    import.add(p, j);
  }
  return import.finish();
}

// The first bytes of a file (the SQLite header needs 16), without reading the rest.
std::string head_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char buf[16] = {};
  in.read(buf, sizeof buf);
  return std::string(buf, static_cast<std::size_t>(in.gcount()));
}

}  // namespace

Trace read_trace(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return read_folder(path);
  if (is_sqlite_file(head_of(path))) return trace_from_nsys_sqlite(path);
  std::string text = ir::read_file(path, "trace");
  if (is_gzip(text)) text = gunzip(text, path);
  nlohmann::json j = ir::parse_json(text, path);
  if (is_kineto_json(j) && !is_tdpipe_chrome(j)) {
    std::vector<std::pair<std::string, nlohmann::json>> files;
    files.emplace_back(path, std::move(j));
    return trace_from_kineto(files);
  }
  return trace_from_chrome_json(j, path);
}

TraceFormat trace_format_from_string(const std::string& name) {
  if (name == "chrome") return TraceFormat::Chrome;
  if (name == "kineto") return TraceFormat::Kineto;
  throw Error(fmt::format("trace format \"{}\": expected chrome or kineto", name));
}

void write_trace(const Trace& trace, const std::string& path, TraceFormat format) {
  if (format == TraceFormat::Kineto)
    write_kineto_dir(trace, path);
  else
    write_chrome_trace(trace, path);
}

}  // namespace tdpipe::traces
