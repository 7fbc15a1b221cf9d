// checkpoint.cpp — rank files (a JSON header line and the raw doubles), the manifest,
// finding the newest complete checkpoint, pruning.
#include "tdpipe/exec/checkpoint.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tdpipe/exec/faults.hpp"
#include "tdpipe/ir/atomic_file.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kMagic = "TDPCKPT1\n";
constexpr std::int64_t kMaxHeader = 16 << 20;

std::uint32_t crc_of(std::string_view data) { return crc32_of(data.data(), data.size()); }

std::string rank_file_name(int rank) { return fmt::format("rank-{:04d}.ckpt", rank); }

std::string encode(const RankCheckpoint& r, int steps_done) {
  json header;
  header["world_rank"] = r.world_rank;
  header["steps_done"] = steps_done;
  json arrays = json::array();
  for (const auto& [name, values] : r.arrays) arrays.push_back({name, values.size()});
  header["arrays"] = arrays;
  header["loss_scale"] = {{"scales", r.loss_scale.scales}, {"good", r.loss_scale.good},
                          {"skipped", r.loss_scale.skipped}};
  std::string out(kMagic);
  out += header.dump();
  out += '\n';
  for (const auto& [name, values] : r.arrays)
    if (!values.empty())  // (an empty vector's data() may be null)
      out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
  return out;
}

RankCheckpoint decode(const std::string& data, const std::string& path) {
  auto bad = [&](const std::string& why) { return Error(fmt::format("checkpoint file {}: {}", path, why)); };
  if (data.compare(0, kMagic.size(), kMagic) != 0) throw bad("not a tdpipe checkpoint (no TDPCKPT1 header)");
  const auto eol = data.find('\n', kMagic.size());
  if (eol == std::string::npos || static_cast<std::int64_t>(eol) > kMaxHeader) throw bad("its header line is cut short");
  RankCheckpoint r;
  std::size_t at = eol + 1;
  try {
    const json h = json::parse(data.begin() + static_cast<std::ptrdiff_t>(kMagic.size()),
                               data.begin() + static_cast<std::ptrdiff_t>(eol));
    r.world_rank = h.at("world_rank").get<int>();
    const auto& ls = h.at("loss_scale");
    r.loss_scale.scales = ls.at("scales").get<std::vector<double>>();
    r.loss_scale.good = ls.at("good").get<std::vector<int>>();
    r.loss_scale.skipped = ls.at("skipped").get<int>();
    for (const auto& a : h.at("arrays")) {
      const auto n = a.at(1).get<std::uint64_t>();
      if (n > (data.size() - at) / sizeof(double))
        throw bad(fmt::format("array {} of {} values runs past the file's end", a.at(0).get<std::string>(), n));
      std::vector<double> values(n);
      if (n > 0) std::memcpy(values.data(), data.data() + at, n * sizeof(double));
      at += n * sizeof(double);
      r.arrays.emplace_back(a.at(0).get<std::string>(), std::move(values));
    }
  } catch (const json::exception& e) {
    throw bad(fmt::format("its header is not what tdpipe writes ({})", e.what()));
  }
  if (at != data.size()) throw bad(fmt::format("{} bytes after its last array", data.size() - at));
  return r;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("checkpoint file {}: cannot be read ({})", path.string(), std::strerror(errno)));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(fmt::format("checkpoint file {}: read failed", path.string()));
  return data;
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// step-NNNNNNNN folders of `dir` by steps done, oldest first.
std::vector<std::pair<int, fs::path>> step_folders(const std::string& dir) {
  std::vector<std::pair<int, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int steps = -1;
    char tail = 0;
    if (e.is_directory(ec) && std::sscanf(name.c_str(), "step-%d%c", &steps, &tail) == 1 && steps >= 0)
      out.emplace_back(steps, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The manifest of `folder` if it is complete (with `verify`: every file's CRC checked
// too); else why not (in `why`).
std::optional<CheckpointManifest> complete_manifest(const fs::path& folder, std::string& why, bool verify) {
  const fs::path path = folder / "MANIFEST.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    why = fmt::format("{}: no MANIFEST.json (a checkpoint that did not finish)", folder.string());
    return std::nullopt;
  }
  CheckpointManifest m;
  try {
    const json j = json::parse(read_all(path));
    m.steps_done = j.at("steps_done").get<int>();
    if (fs::path(checkpoint_folder(folder.parent_path().string(), m.steps_done)).filename() != folder.filename())
      throw Error(fmt::format("it says {} steps done, but its folder is {}", m.steps_done, folder.filename().string()));
    m.run = j.at("run").get<std::map<std::string, std::string>>();
    m.first_step = j.at("first_step").get<int>();
    // JSON has no NaN or inf: a diverged step's loss was written as null.
    auto values = [&](const char* key) {
      std::vector<double> v;
      for (const auto& x : j.at(key)) v.push_back(x.is_null() ? std::numeric_limits<double>::quiet_NaN() : x.get<double>());
      return v;
    };
    m.loss_per_step = values("loss_per_step");
    m.iteration_seconds = values("iteration_seconds");
    for (const auto& f : j.at("files"))
      m.files.push_back({f.at("name").get<std::string>(), f.at("bytes").get<std::int64_t>(), f.at("crc32").get<std::uint32_t>()});
  } catch (const std::exception& e) {
    why = fmt::format("{}: unreadable ({})", path.string(), e.what());
    return std::nullopt;
  }
  for (const auto& f : m.files) {
    const fs::path file = folder / f.name;
    const auto size = fs::file_size(file, ec);
    if (ec || static_cast<std::int64_t>(size) != f.bytes) {
      why = fmt::format("{}: {} bytes, the manifest says {}", file.string(), ec ? 0 : size, f.bytes);
      return std::nullopt;
    }
    if (verify && crc_of(read_all(file)) != f.crc) {
      why = fmt::format("{}: its CRC-32 is not the manifest's (damaged)", file.string());
      return std::nullopt;
    }
  }
  return m;
}

}  // namespace

std::string checkpoint_folder(const std::string& dir, int steps_done) {
  return (fs::path(dir) / fmt::format("step-{:08d}", steps_done)).string();
}

namespace {

// The folder of a checkpoint about to be written, without what an earlier write of it
// that died left behind: `rank`'s temporary files (all ranks' when rank < 0) and, when
// `manifest_too`, the old manifest (not valid for the new files).
fs::path prepare_folder(const std::string& dir, int steps_done, int rank, bool manifest_too) {
  const fs::path folder = checkpoint_folder(dir, steps_done);
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) throw Error(fmt::format("checkpoint folder {}: cannot be made ({})", folder.string(), ec.message()));
  const std::string own = rank < 0 ? "." : "." + rank_file_name(rank) + ".tmp-";
  for (const auto& e : fs::directory_iterator(folder, ec))
    if (const std::string name = e.path().filename().string();
        name.starts_with(own) && name.find(".tmp-") != std::string::npos)
      fs::remove(e.path(), ec);
  if (manifest_too) fs::remove(folder / "MANIFEST.json", ec);
  return folder;
}

// One rank's file; `fail` leaves half of it in a temporary file and throws, as a
// process that dies mid-write (or a full disk) does.
CheckpointManifest::File write_rank_file(const fs::path& folder, const RankCheckpoint& r, int steps_done, bool fail) {
  const std::string data = encode(r, steps_done);
  const fs::path path = folder / rank_file_name(r.world_rank);
  if (fail) {
    std::ofstream part(folder / ("." + rank_file_name(r.world_rank) + ".tmp-partial"), std::ios::binary);
    part.write(data.data(), static_cast<std::streamsize>(data.size() / 2));
    throw Error(fmt::format("checkpoint {}: the write of {} died after {} of its {} bytes (injected)",
                            folder.string(), path.filename().string(), data.size() / 2, data.size()));
  }
  ir::write_file_atomic(path.string(), data, "checkpoint file");
  return {path.filename().string(), static_cast<std::int64_t>(data.size()), crc_of(data)};
}

// MANIFEST.json, last and atomically, then the folders synced.
void write_manifest(const std::string& dir, const fs::path& folder, const CheckpointManifest& manifest) {
  json j;
  j["format"] = "tdpipe checkpoint 1";
  j["steps_done"] = manifest.steps_done;
  j["run"] = manifest.run;
  j["first_step"] = manifest.first_step;
  j["loss_per_step"] = manifest.loss_per_step;
  j["iteration_seconds"] = manifest.iteration_seconds;
  j["files"] = json::array();
  for (const auto& f : manifest.files) j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32", f.crc}});
  ir::write_file_atomic((folder / "MANIFEST.json").string(), j.dump(1) + "\n", "checkpoint manifest");
  fsync_dir(folder);
  fsync_dir(dir);
}

}  // namespace

CheckpointWrite write_checkpoint(const std::string& dir, CheckpointManifest manifest,
                                 const std::vector<RankCheckpoint>& ranks, int fail_rank) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path folder = prepare_folder(dir, manifest.steps_done, -1, true);
  CheckpointWrite w;
  manifest.files.clear();
  for (const RankCheckpoint& r : ranks) {
    manifest.files.push_back(write_rank_file(folder, r, manifest.steps_done, r.world_rank == fail_rank));
    w.bytes += manifest.files.back().bytes;
  }
  write_manifest(dir, folder, manifest);
  w.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return w;
}

CheckpointManifest::File write_checkpoint_part(const std::string& dir, int steps_done, const RankCheckpoint& rank,
                                               bool fail) {
  const fs::path folder = prepare_folder(dir, steps_done, rank.world_rank, rank.world_rank == 0);
  return write_rank_file(folder, rank, steps_done, fail);
}

void finish_checkpoint(const std::string& dir, const CheckpointManifest& manifest) {
  write_manifest(dir, checkpoint_folder(dir, manifest.steps_done), manifest);
}

std::optional<CheckpointManifest> checkpoint_at(const std::string& dir, int steps_done,
                                                const std::map<std::string, std::string>& run) {
  std::string why;
  auto m = complete_manifest(checkpoint_folder(dir, steps_done), why, /*verify=*/true);
  if (m)
    for (const auto& [key, want] : run)
      if (const auto got = m->run.find(key); got == m->run.end() || got->second != want)
        throw Error(fmt::format("checkpoint {} belongs to another run: its {} is not this run's",
                                checkpoint_folder(dir, steps_done), key));
  return m;
}

std::optional<CheckpointManifest> latest_checkpoint(const std::string& dir, const std::map<std::string, std::string>& run,
                                                    std::vector<std::string>* skipped) {
  auto folders = step_folders(dir);
  for (auto it = folders.rbegin(); it != folders.rend(); ++it) {
    std::string why;
    auto m = complete_manifest(it->second, why, /*verify=*/true);
    if (!m) {
      if (skipped) skipped->push_back(why);
      continue;
    }
    for (const auto& [key, want] : run) {
      const auto got = m->run.find(key);
      if (got == m->run.end() || got->second != want)
        throw Error(fmt::format("checkpoint {} belongs to another run: its {} is {}, this run's is {}",
                                it->second.string(), key, got == m->run.end() ? "not recorded" : "\"" + got->second + "\"",
                                "\"" + want + "\""));
    }
    return m;
  }
  return std::nullopt;
}

RankCheckpoint read_rank_checkpoint(const std::string& dir, const CheckpointManifest& manifest, int rank) {
  if (rank < 0 || rank >= static_cast<int>(manifest.files.size()))
    throw Error(fmt::format("checkpoint {}: no file for world rank {} (it has {})",
                            checkpoint_folder(dir, manifest.steps_done), rank, manifest.files.size()));
  const auto& f = manifest.files[static_cast<std::size_t>(rank)];
  const fs::path path = fs::path(checkpoint_folder(dir, manifest.steps_done)) / f.name;
  const std::string data = read_all(path);
  if (static_cast<std::int64_t>(data.size()) != f.bytes || crc_of(data) != f.crc)
    throw Error(fmt::format("checkpoint file {}: {} bytes with CRC-32 {:08x}, the manifest says {} bytes, {:08x}: "
                            "damaged", path.string(), data.size(), crc_of(data), f.bytes, f.crc));
  RankCheckpoint r = decode(data, path.string());
  if (r.world_rank != rank)
    throw Error(fmt::format("checkpoint file {}: holds world rank {}, expected {}", path.string(), r.world_rank, rank));
  return r;
}

void prune_checkpoints(const std::string& dir, int keep) {
  const auto folders = step_folders(dir);
  int complete = 0;
  for (auto it = folders.rbegin(); it != folders.rend(); ++it) {
    std::string why;
    const bool ok = complete_manifest(it->second, why, /*verify=*/false).has_value();
    if (complete >= keep || (complete > 0 && !ok)) {
      std::error_code ec;
      fs::remove_all(it->second, ec);
      continue;
    }
    if (ok) ++complete;
  }
}

bool has_checkpoints(const std::string& dir) { return !step_folders(dir).empty(); }

}  // namespace tdpipe::exec
