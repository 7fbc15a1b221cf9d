// cpu_corpus.cpp — character vocabulary and deterministic sequence sampling.
#include "tdpipe/exec/cpu/corpus.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"

#ifndef TDPIPE_EXEC_DATA_DIR
#define TDPIPE_EXEC_DATA_DIR "data"
#endif

namespace tdpipe::exec::cpu {
namespace {
// splitmix64: a fixed, portable mixer (std distributions differ between libraries).
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

Corpus::Corpus(const std::string& text) {
  alphabet_ = text;
  std::sort(alphabet_.begin(), alphabet_.end());
  alphabet_.erase(std::unique(alphabet_.begin(), alphabet_.end()), alphabet_.end());
  ids_.reserve(text.size());
  for (char c : text)
    ids_.push_back(static_cast<int>(std::lower_bound(alphabet_.begin(), alphabet_.end(), c) -
                                    alphabet_.begin()));
}

Corpus Corpus::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot read the corpus", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.size() < 64) throw Error(fmt::format("{}: corpus too short ({} bytes)", path, text.size()));
  return Corpus(text);
}

std::string Corpus::default_path() {
  if (const char* dir = std::getenv("TDPIPE_DATA_DIR")) return std::string(dir) + "/tiny_corpus.txt";
  const std::string built = std::string(TDPIPE_EXEC_DATA_DIR) + "/tiny_corpus.txt";
  if (std::filesystem::exists(built)) return built;
  // Installed (cmake --install): PREFIX/bin/tdpipe reads PREFIX/share/tdpipe/data.
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path installed = self.parent_path().parent_path() / "share/tdpipe/data/tiny_corpus.txt";
    if (std::filesystem::exists(installed)) return installed.string();
  }
#ifdef TDPIPE_EXEC_INSTALLED_DATA_DIR
  // A program of its own linking an installed libtdpipe_exec: the install's data.
  if (const std::string prefix = std::string(TDPIPE_EXEC_INSTALLED_DATA_DIR) + "/tiny_corpus.txt";
      std::filesystem::exists(prefix))
    return prefix;
#endif
  return built;
}

std::string Corpus::decode(const std::vector<int>& ids) const {
  std::string s;
  for (int id : ids) s += alphabet_.at(static_cast<std::size_t>(id));
  return s;
}

std::vector<int> Corpus::sequence(std::uint64_t seed, int step, int index, int seq) const {
  const auto n = static_cast<std::int64_t>(ids_.size());
  if (n < seq + 2)
    throw Error(fmt::format("corpus of {} characters is shorter than a sequence of {} + 1", n, seq));
  const std::uint64_t h = mix(seed ^ mix(static_cast<std::uint64_t>(step) * 1000003ull +
                                         static_cast<std::uint64_t>(index)));
  const auto offset = static_cast<std::int64_t>(h % static_cast<std::uint64_t>(n - seq - 1));
  return {ids_.begin() + offset, ids_.begin() + offset + seq + 1};
}

MicroBatch load_micro_batch(const Corpus& corpus, std::uint64_t seed, int step, int replica,
                            int microbatches, int mb, int micro_batch, int seq) {
  MicroBatch out;
  for (int i = 0; i < micro_batch; ++i) {
    const int index = (replica * microbatches + mb) * micro_batch + i;
    std::vector<int> s = corpus.sequence(seed, step, index, seq);
    out.tokens.emplace_back(s.begin(), s.end() - 1);
    out.targets.emplace_back(s.begin() + 1, s.end());
  }
  return out;
}

}  // namespace tdpipe::exec::cpu
