// serving.hpp — LLM serving in the IR: the scenario's `serving:` workload, its requests,
// and the serving table a serving plan's PREFILL / DECODE ops index.
//
// Offline batch serving (the TD-Pipe paper's setting, and vLLM's benchmark with
// ignore-EOS): N requests arrive at time 0, each with a prompt of known length and a
// fixed number of output tokens. A plan processes them in batches; a batch is a list of
// items, each a run of one request's tokens at known positions — a whole prompt
// (prefill) or one token (decode) — so one cost formula and one executor path serve
// prefill, decode and mixed (continuous-batching) steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tdpipe::ir {

/// Most requests a workload may hold (a million plans in seconds; ten would need tens of
/// GiB of plan), and most tokens one prompt or output may have.
inline constexpr int kMaxServingRequests = 1'000'000;
inline constexpr int kMaxRequestTokens = 1 << 24;

/// A distribution of token counts. Lengths are integers in [min, max].
///  - "lognormal": exp(N(μ, σ²)) with μ chosen so the unclipped mean is `mean`, rounded
///    and clipped — the shape of ShareGPT's prompt and output lengths;
///  - "uniform": uniform integers in [min, max] (`mean` unused);
///  - "fixed": every length `mean`.
struct LengthDistribution {
  std::string kind = "lognormal";
  double mean = 0;
  double sigma = 1.0;
  int min = 1;
  int max = 1024;
  friend bool operator==(const LengthDistribution&, const LengthDistribution&) = default;
};

/// The scenario's `serving:` section.
struct ServingConfig {
  int requests = 5000;           ///< N
  std::uint64_t seed = 1;        ///< of the generated lengths (and the CPU executor's prompt tokens)
  /// ShareGPT-like defaults: means of vLLM's ShareGPT workload (Kwon et al., SOSP 2023:
  /// 161 prompt and 338 output tokens on average), prompts ≤ 1,024 tokens as in the
  /// TD-Pipe paper; σ = 1 is this project's assumption for the spread (documented in
  /// scenarios/README.md).
  LengthDistribution prompt{"lognormal", 161, 1.0, 4, 1024};
  LengthDistribution output{"lognormal", 338, 1.0, 1, 1024};
  /// A JSON file of requests ([{"prompt": P, "output": O}, …]) instead of generated
  /// lengths; relative to the scenario file.
  std::string requests_file;
  /// Share of each GPU's memory that weights and the KV cache may use (vLLM's
  /// gpu_memory_utilization); the KV cache gets what the weights leave of it.
  double memory_fraction = 0.9;
  /// tdpipe planner: keep prefilling while the projected peak KV use stays under this
  /// share of the KV blocks (the paper's controller: 0.9).
  double kv_fraction = 0.9;
  int block_tokens = 16;          ///< tokens per paged KV block (vLLM's block size)
  int max_batch_tokens = 2048;    ///< tokens one batch may process (vLLM's max_num_batched_tokens)
  int max_batch_requests = 256;   ///< requests one batch may hold (vLLM's max_num_seqs)
  std::string planner = "tdpipe"; ///< pp | tp | tdpipe
  friend bool operator==(const ServingConfig&, const ServingConfig&) = default;
};

/// Planner names a serving scenario may give.
const std::vector<std::string>& serving_planner_names();

/// One request: its prompt, and the tokens it generates (the first by its prefill).
struct Request {
  int prompt = 0;
  int output = 0;
  friend bool operator==(const Request&, const Request&) = default;
};

/// The scenario's requests: read from requests_file (resolved against `base_dir` when
/// relative) or generated from the distributions with the seed (std::mt19937_64 and
/// Box–Muller, so every platform draws the same lengths). Throws tdpipe::Error naming the
/// file, the entry and the field.
std::vector<Request> serving_requests(const ServingConfig& config, const std::string& base_dir = "");
/// Requests from JSON text ([{"prompt": P, "output": O}, …] or {"requests": [...]});
/// `source` names it in errors.
std::vector<Request> parse_requests(const std::string& text, const std::string& source);

/// Tokens [position, position + tokens) of request `request` in one batch: a prefill
/// item starts at position 0 and covers the prompt; a decode item is one token at
/// position prompt + k − 1 (it produces output token k).
struct ServeItem {
  int request = 0;
  int position = 0;
  int tokens = 0;
  friend bool operator==(const ServeItem&, const ServeItem&) = default;
};

struct ServeBatch {
  std::vector<ServeItem> items;
  /// The controller's phase window this batch belongs to (tdpipe: 0, 1, 2, … as prefill
  /// and decode windows alternate; pp and tp: 0). A stage's idle time before a batch of
  /// another phase than its previous one is a phase-switch bubble.
  int phase = 0;
  /// Requests whose KV cache is dropped before this batch runs: vLLM's recompute
  /// preemption (pp, tp); such a request comes back later as a prefill of its prompt and
  /// the tokens it generated.
  std::vector<int> preempted;
  friend bool operator==(const ServeBatch&, const ServeBatch&) = default;
  /// Whether an item starts a request's cache (position 0): the batch runs as PREFILL.
  bool has_prefill() const;
};

/// The serving table of a serving plan: op PREFILL/DECODE k (Op::mb = k) runs
/// batches[k] on its stage. Every stage runs every batch, in the table's order.
struct ServePlan {
  std::string planner;                 ///< pp | tp | tdpipe
  std::vector<Request> requests;
  std::vector<ServeBatch> batches;
  int block_tokens = 16;
  /// KV-cache bytes of one token on each pipeline rank (its layers, its share of the
  /// K/V heads), and the bytes each rank's KV cache may use.
  std::vector<double> kv_bytes_per_token;
  std::vector<double> kv_capacity_bytes;
  std::uint64_t seed = 1;              ///< the CPU executor draws prompt tokens from it
  friend bool operator==(const ServePlan&, const ServePlan&) = default;
};

/// The serving table as a plan file holds it ("serve"): items as flat [request, position,
/// tokens] triples per batch.
nlohmann::json to_json(const ServePlan& serve);
/// Reads and checks it (requests ≥ 1 token each, items inside their request, capacities
/// per rank); throws tdpipe::Error naming the path ("plan.serve.batches[3].items[2]").
ServePlan serve_from_json(const nlohmann::json& j, const std::string& path);

/// KV blocks a request holds with `tokens` tokens cached: ⌈tokens / block_tokens⌉.
inline std::int64_t kv_blocks(std::int64_t tokens, int block_tokens) {
  return block_tokens > 0 ? (tokens + block_tokens - 1) / block_tokens : tokens;
}

}  // namespace tdpipe::ir
