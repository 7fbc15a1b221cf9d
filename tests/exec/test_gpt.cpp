// test_gpt.cpp — the CPU model alone: temporal slices and stage splits compute
// exactly what the whole sequence on one stage computes; gradients match finite
// differences; layer partition and corpus sampling.
#include <catch2/catch.hpp>

#include "exec_test_util.hpp"
#include "tdpipe/exec/cpu/corpus.hpp"
#include "tdpipe/exec/backend.hpp"
#include "tdpipe/exec/cpu/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

namespace tdpipe::exec::cpu {
namespace {

GptConfig tiny_config() {
  GptConfig c;
  c.layers = 3;
  c.hidden = 8;
  c.heads = 2;
  c.ffn = 16;
  c.seq = 12;
  c.vocab = 32;
  c.micro_batch = 2;
  return c;
}

MicroBatch tiny_batch(const GptConfig& c) {
  const Corpus corpus = Corpus::load(test::source_path("data/tiny_corpus.txt"));
  return load_micro_batch(corpus, 3, 0, 0, 1, 0, c.micro_batch, c.seq);
}

// Runs forward of `bounds` slices in order, then B in reverse and W; returns loss.
double run_sliced(std::vector<GptStage>& stages, const MicroBatch& mb, const std::vector<int>& bounds,
                  double scale, bool split_w) {
  double loss = 0;
  const int S = static_cast<int>(bounds.size()) - 1;
  for (auto& s : stages) s.begin_step();
  for (int j = 0; j < S; ++j) {
    Mat x;
    for (auto& st : stages)
      x = st.forward(0, j, bounds[j], bounds[j + 1], x, &mb.tokens, &mb.targets, scale, &loss);
  }
  for (int j = S - 1; j >= 0; --j) {
    Mat g;
    for (auto it = stages.rbegin(); it != stages.rend(); ++it) {
      g = it->backward_input(0, j, g);
      if (!split_w) it->backward_weight(0, j);
    }
  }
  if (split_w)
    for (int j = 0; j < S; ++j)
      for (auto& st : stages) st.backward_weight(0, j);
  return loss;
}

ParamMap merged_grads(const std::vector<GptStage>& stages) {
  ParamMap out;
  for (const auto& s : stages) out.merge(s.named_grads());
  return out;
}

/// The whole model on one stage and the whole sequence: loss and gradients to match.
struct Reference {
  double loss;
  ParamMap grads;
};
Reference whole_model(const GptConfig& c, const MicroBatch& mb, double scale) {
  std::vector<GptStage> whole;
  whole.emplace_back(c, 0, 1);
  const double loss = run_sliced(whole, mb, {0, c.seq}, scale, false);
  return {loss, merged_grads(whole)};
}

/// Runs `stages` over `bounds` and checks the loss and every gradient against `ref`.
void check_against(std::vector<GptStage>& stages, const MicroBatch& mb, const std::vector<int>& bounds,
                   double scale, bool split_w, const Reference& ref) {
  const double loss = run_sliced(stages, mb, bounds, scale, split_w);
  CHECK(loss == Approx(ref.loss).epsilon(1e-12));
  std::string worst;
  const double err = test::max_rel_error(merged_grads(stages), ref.grads, &worst);
  INFO("worst " << worst);
  CHECK(err < 1e-10);
}

}  // namespace

TEST_CASE("temporal slices and stage splits give the whole-sequence gradients", "[exec][gpt]") {
  const GptConfig c = tiny_config();
  const MicroBatch mb = tiny_batch(c);
  const double scale = 1.0 / (c.micro_batch * c.seq);
  const Reference ref = whole_model(c, mb, scale);

  const std::vector<std::vector<int>> slicings = {{0, 12}, {0, 6, 12}, {0, 5, 9, 12}, {0, 1, 2, 7, 12}};
  for (int nstages : {1, 2, 3, 4})
    for (const auto& bounds : slicings)
      for (bool split_w : {false, true}) {
        INFO("stages " << nstages << " slices " << bounds.size() - 1 << " split W " << split_w);
        std::vector<GptStage> stages;
        for (int s = 0; s < nstages; ++s) stages.emplace_back(c, s, nstages);
        check_against(stages, mb, bounds, scale, split_w, ref);
      }
}

TEST_CASE("gradients match central finite differences", "[exec][gpt]") {
  GptConfig c = tiny_config();
  c.layers = 1;
  const MicroBatch mb = tiny_batch(c);
  const double scale = 1.0 / (c.micro_batch * c.seq);
  std::vector<GptStage> st;
  st.emplace_back(c, 0, 1);
  run_sliced(st, mb, {0, 4, 12}, scale, true);
  const std::vector<double> g = st[0].grads();
  std::vector<double>& w = st[0].params();
  // A spread of parameters across every tensor kind.
  for (std::size_t i = 3; i < w.size(); i += w.size() / 37) {
    const double keep = w[i], h = 1e-5;
    w[i] = keep + h;
    const double lp = run_sliced(st, mb, {0, 12}, scale, false);
    w[i] = keep - h;
    const double lm = run_sliced(st, mb, {0, 12}, scale, false);
    w[i] = keep;
    INFO("parameter " << i);
    CHECK(g[i] == Approx((lp - lm) / (2 * h)).margin(1e-8).epsilon(1e-5));
  }
}

TEST_CASE("stage_layers splits contiguously and covers every layer once", "[exec][gpt]") {
  GptConfig c;
  c.layers = 8;
  CHECK(stage_layers(c, 0, 4) == std::pair{0, 2});
  CHECK(stage_layers(c, 3, 4) == std::pair{6, 8});
  // Remainder goes to the last stages: 5 over 3 → 1, 2, 2.
  c.layers = 5;
  CHECK(stage_layers(c, 0, 3) == std::pair{0, 1});
  CHECK(stage_layers(c, 1, 3) == std::pair{1, 3});
  CHECK(stage_layers(c, 2, 3) == std::pair{3, 5});
  // More stages than layers: some stages are empty pass-throughs.
  c.layers = 2;
  CHECK(stage_layers(c, 0, 4) == std::pair{0, 0});
  CHECK(stage_layers(c, 3, 4) == std::pair{1, 2});
  // A given partition (the plan's stage_layers) is followed exactly.
  c.layers = 7;
  c.partition = {1, 4, 2};
  CHECK(stage_layers(c, 0, 3) == std::pair{0, 1});
  CHECK(stage_layers(c, 1, 3) == std::pair{1, 5});
  CHECK(stage_layers(c, 2, 3) == std::pair{5, 7});
  CHECK(stage_parameter_count(c, 1, 3) ==
        4 * (4LL * c.hidden * c.hidden + 2LL * c.hidden * c.ffn + 6LL * c.hidden + c.ffn));
  c.partition = {1, 4, 1};
  CHECK_THROWS_WITH(stage_layers(c, 0, 3), Catch::Contains("[1,4,1]") && Catch::Contains("summing to the model's 7"));
  c.partition = {3, 4};
  CHECK_THROWS_WITH(stage_layers(c, 0, 3), Catch::Contains("expected 3 layer counts"));
}

TEST_CASE("uneven stage partitions give the whole-model gradients", "[exec][gpt]") {
  GptConfig c = tiny_config();
  c.layers = 5;
  const MicroBatch mb = tiny_batch(c);
  const double scale = 1.0 / (c.micro_batch * c.seq);
  const Reference ref = whole_model(c, mb, scale);
  for (const std::vector<int>& partition : {std::vector<int>{1, 4}, {3, 1, 1}, {1, 3, 1}, {2, 1, 1, 1}}) {
    GptConfig cut = c;
    cut.partition = partition;
    const int n = static_cast<int>(partition.size());
    std::vector<GptStage> stages;
    for (int s = 0; s < n; ++s) stages.emplace_back(cut, s, n);
    INFO("partition of " << n << " stages, first " << partition[0]);
    check_against(stages, mb, {0, 5, 12}, scale, true, ref);
    CHECK(merged_grads(stages).size() == ref.grads.size());
  }
}

TEST_CASE("corpus sampling is deterministic and replica-aware", "[exec][gpt]") {
  const Corpus corpus = Corpus::load(test::source_path("data/tiny_corpus.txt"));
  CHECK(corpus.vocab() == 29);
  const auto a = load_micro_batch(corpus, 7, 2, 1, 4, 3, 2, 16);
  const auto b = load_micro_batch(corpus, 7, 2, 1, 4, 3, 2, 16);
  CHECK(a.tokens == b.tokens);
  // Targets are the inputs shifted by one token.
  CHECK(std::vector<int>(a.tokens[0].begin() + 1, a.tokens[0].end()) ==
        std::vector<int>(a.targets[0].begin(), a.targets[0].end() - 1));
  // Replica 1, micro-batch 3 of 4, sequence 1 is global sequence (1·4 + 3)·2 + 1 = 15.
  const std::vector<int> global15 = corpus.sequence(7, 2, 15, 16);
  CHECK(a.tokens[1] == std::vector<int>(global15.begin(), global15.end() - 1));
  CHECK_THROWS_WITH(Corpus::load("/nonexistent/corpus.txt"),
                    Catch::Contains("/nonexistent/corpus.txt") && Catch::Contains("cannot read"));
}

TEST_CASE("from_scenario refuses SwiGLU and grouped-query attention - accepts either attention kernel",
          "[exec][gpt]") {
  ir::Scenario sc = test::small_scenario(2, 1, 2, 1);
  for (const char* attention : {"flash", "standard"}) {
    sc.model.attention = attention;
    CHECK(GptConfig::from_scenario(sc).heads == 2);
  }
  sc.model.kv_heads = 2;  // = heads: still multi-head attention
  CHECK_NOTHROW(GptConfig::from_scenario(sc));

  ir::Scenario swiglu = sc;
  swiglu.model.mlp = "swiglu";
  CHECK_THROWS_WITH(GptConfig::from_scenario(swiglu),
                    Catch::Contains("scenarios/tiny-gpt-cpu.yaml: model.mlp: expected gelu, got \"swiglu\"") &&
                        Catch::Contains("the CPU executor runs GeLU multi-head attention only"));
  ir::Scenario gqa = sc;
  gqa.model.kv_heads = 1;
  CHECK_THROWS_WITH(GptConfig::from_scenario(gqa),
                    Catch::Contains("scenarios/tiny-gpt-cpu.yaml: model.kv_heads: expected heads = 2, got 1") &&
                        Catch::Contains("the CPU executor runs GeLU multi-head attention only"));
}

TEST_CASE("stage_parameter_count is what a built stage holds", "[exec][gpt]") {
  GptConfig c;
  c.layers = 5;
  c.hidden = 24;
  c.heads = 3;
  c.ffn = 40;
  c.seq = 12;
  c.vocab = 30;
  for (int stages : {1, 2, 3, 7})
    for (int stage = 0; stage < stages; ++stage) {
      INFO(stages << " stages, stage " << stage);
      GptStage built(c, stage, stages);
      CHECK(stage_parameter_count(c, stage, stages) == static_cast<std::int64_t>(built.params().size()));
    }
}

}  // namespace tdpipe::exec::cpu

namespace tdpipe::exec::cpu {

TEST_CASE("a sharded optimizer's ranges cover every parameter once - Adam over a range steps only it",
          "[exec][gpt][zero1]") {
  // owned_ranges: over all members, the segments of every bucket tile [0, n) exactly.
  for (const auto& [n, buckets, members] : std::vector<std::tuple<std::int64_t, int, int>>{
           {10, 1, 2}, {1001, 3, 4}, {7, 5, 3}, {2, 2, 3}}) {
    std::vector<int> owners(static_cast<std::size_t>(n), 0);
    for (int m = 0; m < members; ++m)
      for (const auto& [b, e] : owned_ranges(n, buckets, OptimizerShard{m, members, {}})) {
        REQUIRE(b < e);
        for (std::int64_t i = b; i < e; ++i) ++owners[static_cast<std::size_t>(i)];
      }
    INFO("n " << n << " buckets " << buckets << " members " << members);
    CHECK(std::all_of(owners.begin(), owners.end(), [](int k) { return k == 1; }));
  }
  CHECK(owned_segment(0, 4) == 1);
  CHECK(owned_segment(3, 4) == 0);
  CHECK_THROWS_WITH(owned_segment(4, 4), Catch::Contains("member 4 of 4"));

  GptConfig c = tiny_config();
  GptStage whole(c, 0, 1), part(c, 0, 1);
  for (GptStage* s : {&whole, &part})
    for (std::size_t i = 0; i < s->grads().size(); ++i) s->grads()[i] = std::sin(0.1 * static_cast<double>(i));
  const auto before = part.params();
  const std::int64_t n = static_cast<std::int64_t>(before.size()), b = n / 3, e = 2 * n / 3;
  AdamConfig a;
  whole.adam(a, 1);
  part.adam(a, 1, b, e);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (i >= b && i < e)
      REQUIRE(part.params()[k] == whole.params()[k]);
    else
      REQUIRE(part.params()[k] == before[k]);
  }
  CHECK(part.moments(1)[0] == 0.0);
  CHECK(part.moments(1)[static_cast<std::size_t>(b)] == whole.moments(1)[static_cast<std::size_t>(b)]);
  CHECK_THROWS_WITH(part.adam(a, 1, e, b), Catch::Contains("Adam over parameters"));
}

}  // namespace tdpipe::exec::cpu
