// corpus.hpp — the bundled character-level corpus and the data loader that cuts
// training sequences from it, identically for every layout of the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tdpipe::exec::cpu {

class Corpus {
 public:
  /// Character-level: the vocabulary is the sorted set of bytes in `text`.
  explicit Corpus(const std::string& text);
  /// Reads a text file; throws tdpipe::Error naming the path when unreadable or too short.
  static Corpus load(const std::string& path);
  /// data/tiny_corpus.txt of the source tree (or $TDPIPE_DATA_DIR/tiny_corpus.txt).
  static std::string default_path();

  int vocab() const { return static_cast<int>(alphabet_.size()); }
  const std::vector<int>& ids() const { return ids_; }
  std::string decode(const std::vector<int>& ids) const;

  /// Global sequence `index` of step `step`: seq + 1 ids from a deterministic
  /// pseudo-random offset (inputs are [0, seq), targets [1, seq + 1)).
  std::vector<int> sequence(std::uint64_t seed, int step, int index, int seq) const;

 private:
  std::string alphabet_;
  std::vector<int> ids_;
};

/// The token rows of one micro-batch: b sequences of inputs and of targets.
struct MicroBatch {
  std::vector<std::vector<int>> tokens;
  std::vector<std::vector<int>> targets;
};

/// Micro-batch `mb` of replica `replica` in step `step`: global sequences
/// (replica · m + mb) · b … + b − 1, so a single-device run over all d · m
/// micro-batches sees exactly the same data.
MicroBatch load_micro_batch(const Corpus& corpus, std::uint64_t seed, int step, int replica,
                            int microbatches, int mb, int micro_batch, int seq);

}  // namespace tdpipe::exec::cpu
