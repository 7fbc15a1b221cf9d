// closest.cpp — "did you mean": the closest known name by edit distance.
#include "tdpipe/ir/closest.hpp"

#include <algorithm>
#include <cctype>
#include <limits>

namespace tdpipe::ir {
namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                        std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (same ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::optional<std::string> closest(std::string_view word, const std::vector<std::string>& known) {
  // A known name the word begins ("a100" → "a100-80g") beats any edit distance; of
  // several, the first listed (the lists put the usual choice first).
  if (!word.empty())
    for (const auto& k : known)
      if (k.size() > word.size() && k.compare(0, word.size(), word) == 0) return k;
  std::optional<std::string> best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& k : known) {
    const std::size_t d = edit_distance(word, k);
    if (d < best_d) best_d = d, best = k;
  }
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  if (best && best_d <= limit) return best;
  return std::nullopt;
}

}  // namespace tdpipe::ir
