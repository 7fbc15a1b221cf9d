// serving.cpp — a serving scenario's requests: generated lengths or a requests file.
#include "tdpipe/ir/serving.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <filesystem>
#include <limits>
#include <random>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/json_read.hpp"

namespace tdpipe::ir {
namespace {

/// A uniform double in (0, 1) from the generator's raw bits (std::uniform_real_distribution
/// is implementation-defined; this is not).
double unit(std::mt19937_64& rng) { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; }

/// One standard normal draw by Box–Muller (two uniforms per draw; no cached second value).
double normal(std::mt19937_64& rng) {
  const double u1 = unit(rng), u2 = unit(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

int draw(const LengthDistribution& d, std::mt19937_64& rng) {
  double x = d.mean;
  if (d.kind == "lognormal") {
    // E[exp(N(μ, σ²))] = exp(μ + σ²/2) = mean.
    const double mu = std::log(d.mean) - 0.5 * d.sigma * d.sigma;
    x = std::exp(mu + d.sigma * normal(rng));
  } else if (d.kind == "uniform") {
    x = d.min + std::floor(unit(rng) * (d.max - d.min + 1));
  }
  const double clipped = std::clamp(std::round(x), static_cast<double>(d.min), static_cast<double>(d.max));
  return static_cast<int>(clipped);
}

}  // namespace

const std::vector<std::string>& serving_planner_names() {
  static const std::vector<std::string> kNames = {"pp", "tp", "tdpipe"};
  return kNames;
}

bool ServeBatch::has_prefill() const {
  return std::any_of(items.begin(), items.end(), [](const ServeItem& i) { return i.position == 0; });
}

std::vector<Request> parse_requests(const std::string& text, const std::string& source) {
  const nlohmann::json j = parse_json(text, source);
  const nlohmann::json* list = &j;
  if (j.is_object()) {
    if (!j.contains("requests") || j.size() != 1)
      throw Error(fmt::format("{}: expected a list of requests, or an object with only \"requests\"", source));
    list = &j.at("requests");
  }
  if (!list->is_array()) throw Error(fmt::format("{}: expected a list of requests, got {}", source, list->type_name()));
  if (list->empty()) throw Error(fmt::format("{}: no requests; expected at least one", source));
  if (static_cast<long long>(list->size()) > kMaxServingRequests)
    throw Error(fmt::format("{}: {} requests; at most {} are planned", source, list->size(), kMaxServingRequests));
  std::vector<Request> out;
  out.reserve(list->size());
  for (std::size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& r = (*list)[i];
    if (!r.is_object())
      throw Error(fmt::format("{}: requests[{}]: expected {{\"prompt\": tokens, \"output\": tokens}}, got {}", source,
                              i, quote_json(r)));
    Request q;
    for (const auto& [key, value] : r.items()) {
      if (key == "id") continue;  // request dumps carry one; the order is the id here
      int* field = key == "prompt" ? &q.prompt : key == "output" ? &q.output : nullptr;
      if (!field)
        throw Error(fmt::format("{}: requests[{}].{}: unknown key; expected prompt, output (and an ignored id)",
                                source, i, key));
      if (!value.is_number_integer() || value.get<long long>() < 1 || value.get<long long>() > kMaxRequestTokens)
        throw Error(fmt::format("{}: requests[{}].{}: expected a token count from 1 to {}, got {}", source, i, key,
                                kMaxRequestTokens, quote_json(value)));
      *field = value.get<int>();
    }
    for (const char* key : {"prompt", "output"})
      if (!r.contains(key)) throw Error(fmt::format("{}: requests[{}].{}: missing", source, i, key));
    out.push_back(q);
  }
  return out;
}

std::vector<Request> serving_requests(const ServingConfig& config, const std::string& base_dir) {
  if (!config.requests_file.empty()) {
    std::filesystem::path path(config.requests_file);
    if (path.is_relative() && !base_dir.empty()) path = std::filesystem::path(base_dir) / path;
    return parse_requests(read_file(path.string(), "requests file"), path.string());
  }
  if (config.requests < 1 || config.requests > kMaxServingRequests)
    throw Error(fmt::format("serving.requests: {}; expected 1 to {}", config.requests, kMaxServingRequests));
  std::mt19937_64 rng(config.seed);
  std::vector<Request> out(static_cast<std::size_t>(config.requests));
  for (Request& r : out) {
    r.prompt = draw(config.prompt, rng);
    r.output = draw(config.output, rng);
  }
  return out;
}

nlohmann::json to_json(const ServePlan& serve) {
  nlohmann::json requests = nlohmann::json::array();
  for (const Request& r : serve.requests) requests.push_back({r.prompt, r.output});
  nlohmann::json batches = nlohmann::json::array();
  for (const ServeBatch& b : serve.batches) {
    std::vector<int> flat;
    flat.reserve(b.items.size() * 3);
    for (const ServeItem& i : b.items) flat.insert(flat.end(), {i.request, i.position, i.tokens});
    nlohmann::json batch = {{"phase", b.phase}, {"items", std::move(flat)}};
    if (!b.preempted.empty()) batch["preempted"] = b.preempted;
    batches.push_back(std::move(batch));
  }
  return {{"planner", serve.planner},
          {"block_tokens", serve.block_tokens},
          {"seed", serve.seed},
          {"kv_bytes_per_token", serve.kv_bytes_per_token},
          {"kv_capacity_bytes", serve.kv_capacity_bytes},
          {"requests", std::move(requests)},
          {"batches", std::move(batches)}};
}

ServePlan serve_from_json(const nlohmann::json& j, const std::string& path) {
  using nlohmann::json;
  const std::vector<std::string> keys = {"planner", "block_tokens", "seed", "kv_bytes_per_token",
                                         "kv_capacity_bytes", "requests", "batches"};
  if (!j.is_object()) throw Error(fmt::format("{}: expected an object, got {}", path, j.type_name()));
  for (const auto& [key, value] : j.items())
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      throw Error(fmt::format("{}.{}: unknown key; known keys: {}", path, key, fmt::join(keys, ", ")));
  for (const auto& key : keys)
    if (!j.contains(key)) throw Error(fmt::format("{}.{}: missing", path, key));
  auto integer = [&](const json& v, const std::string& at, long long lo, long long hi) {
    if (!v.is_number_integer() || v.get<long long>() < lo || v.get<long long>() > hi)
      throw Error(fmt::format("{}: expected an integer from {} to {}, got {}", at, lo, hi, quote_json(v)));
    return v.get<long long>();
  };
  ServePlan s;
  if (!j.at("planner").is_string()) throw Error(fmt::format("{}.planner: expected a string", path));
  s.planner = j.at("planner").get<std::string>();
  s.block_tokens = static_cast<int>(integer(j.at("block_tokens"), path + ".block_tokens", 1, 1 << 20));
  if (!j.at("seed").is_number_unsigned()) throw Error(fmt::format("{}.seed: expected an integer ≥ 0", path));
  s.seed = j.at("seed").get<std::uint64_t>();
  for (const char* key : {"kv_bytes_per_token", "kv_capacity_bytes"}) {
    const json& list = j.at(key);
    if (!list.is_array()) throw Error(fmt::format("{}.{}: expected a list of bytes, one per rank", path, key));
    auto& out = std::string(key) == "kv_bytes_per_token" ? s.kv_bytes_per_token : s.kv_capacity_bytes;
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_number() || !(list[i].get<double>() >= 0) || !std::isfinite(list[i].get<double>()))
        throw Error(fmt::format("{}.{}[{}]: expected a finite number of bytes ≥ 0, got {}", path, key, i,
                                quote_json(list[i])));
      out.push_back(list[i].get<double>());
    }
  }
  const json& requests = j.at("requests");
  if (!requests.is_array() || requests.empty())
    throw Error(fmt::format("{}.requests: expected a list of [prompt, output] pairs", path));
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const std::string at = fmt::format("{}.requests[{}]", path, i);
    if (!requests[i].is_array() || requests[i].size() != 2)
      throw Error(fmt::format("{}: expected [prompt, output], got {}", at, quote_json(requests[i])));
    s.requests.push_back({static_cast<int>(integer(requests[i][0], at + "[0]", 1, kMaxRequestTokens)),
                          static_cast<int>(integer(requests[i][1], at + "[1]", 1, kMaxRequestTokens))});
  }
  const json& batches = j.at("batches");
  if (!batches.is_array()) throw Error(fmt::format("{}.batches: expected a list", path));
  s.batches.reserve(batches.size());
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const std::string at = fmt::format("{}.batches[{}]", path, b);
    const json& batch = batches[b];
    if (!batch.is_object() || !batch.contains("items") || !batch.contains("phase") ||
        batch.size() != 2u + (batch.contains("preempted") ? 1u : 0u))
      throw Error(fmt::format("{}: expected {{\"phase\": k, \"items\": [request, position, tokens, …]}} and "
                              "optionally \"preempted\": [request, …]",
                              at));
    ServeBatch out;
    out.phase = static_cast<int>(integer(batch.at("phase"), at + ".phase", 0, std::numeric_limits<int>::max()));
    const json& items = batch.at("items");
    if (!items.is_array() || items.empty() || items.size() % 3 != 0)
      throw Error(fmt::format("{}.items: expected [request, position, tokens] triples, flat, at least one", at));
    for (std::size_t k = 0; k < items.size(); k += 3) {
      const std::string it = fmt::format("{}.items[{}]", at, k / 3);
      ServeItem item;
      item.request = static_cast<int>(integer(items[k], it + ".request", 0, static_cast<long long>(s.requests.size()) - 1));
      const Request& r = s.requests[static_cast<std::size_t>(item.request)];
      const int total = r.prompt + r.output - 1;  // the last output token is never an input
      item.position = static_cast<int>(integer(items[k + 1], it + ".position", 0, total - 1));
      item.tokens = static_cast<int>(integer(items[k + 2], it + ".tokens", 1, total - item.position));
      out.items.push_back(item);
    }
    if (batch.contains("preempted")) {
      const json& list = batch.at("preempted");
      if (!list.is_array()) throw Error(fmt::format("{}.preempted: expected a list of requests", at));
      for (std::size_t k = 0; k < list.size(); ++k)
        out.preempted.push_back(static_cast<int>(integer(list[k], fmt::format("{}.preempted[{}]", at, k), 0,
                                                         static_cast<long long>(s.requests.size()) - 1)));
    }
    s.batches.push_back(std::move(out));
  }
  return s;
}

}  // namespace tdpipe::ir
