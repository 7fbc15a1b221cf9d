// test_megatron_import.cpp — Megatron-LM arguments → scenario: the fields Megatron's
// own defaults derive, uneven and virtual stages, and clear errors.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/megatron_import.hpp"
#include "tdpipe/ir/scenario_io.hpp"

using namespace tdpipe::ir;
using Catch::Matchers::Contains;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

MegatronCluster gpus(int n) {
  MegatronCluster c;
  c.gpus = n;
  c.name = "imported";
  return c;
}

// GPT-3 175B as Megatron's examples train it (interleaved, SP, distributed optimizer).
const std::string kGpt3 =
    "--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048 "
    "--micro-batch-size 1 --global-batch-size 1536 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 "
    "--num-layers-per-virtual-pipeline-stage 4 --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce "
    "--bf16 --use-flash-attn --tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file "
    "gpt2-merges.txt --data-path my_data --split 969,30,1 --lr 6.0e-5 --min-lr 6.0e-6 --lr-decay-style cosine "
    "--train-iters 500000 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0 "
    "--init-method-std 0.006 --log-interval 100 --save-interval 1000 --eval-interval 1000 --eval-iters 10 "
    "--recompute-activations";

}  // namespace

TEST_CASE("megatron import: GPT-3 175B on 1,024 GPUs - Megatron's derived values", "[megatron][import]") {
  const MegatronImport got = import_megatron(split(kGpt3), gpus(1024));
  const Scenario& s = got.scenario;
  CHECK(s.name == "imported");
  CHECK(s.model.layers == 96);
  CHECK(s.model.hidden == 12288);
  CHECK(s.model.ffn == 4 * 12288);
  CHECK(s.model.heads == 96);
  CHECK(s.model.kv_heads == 0);
  CHECK(s.model.seq == 2048);
  CHECK(s.model.vocab == 51200);  // 50257 padded to a multiple of 128 · t = 1024
  CHECK(s.model.dtype == "bf16");
  CHECK(s.model.mlp == "gelu");
  CHECK(s.model.attention == "flash");
  CHECK(s.cluster.gpus() == 1024);
  CHECK(s.cluster.gpus_per_node == 8);
  CHECK(s.cluster.groups.at(0).gpu.name == "a100-80g");
  CHECK(s.parallel.tensor == 8);
  CHECK(s.parallel.pipeline == 8);
  CHECK(s.parallel.data == 16);
  CHECK(s.parallel.chunks == 3);  // 96 layers / (8 ranks × 4 layers per virtual stage)
  CHECK(s.parallel.micro_batch == 1);
  CHECK(s.parallel.global_batch == 1536);
  CHECK(s.parallel.recompute == Recompute::Selective);
  CHECK(s.parallel.sequence_parallel);
  CHECK(s.parallel.overlap_grad_reduce);
  CHECK(s.parallel.distributed_optimizer);
  CHECK(!s.parallel.tp_comm_overlap);
  CHECK(s.parallel.overlap_p2p);  // interleaved: Megatron overlaps its p2p unless told not to
  // Megatron's DDP bucket: max(40 M, 1 M · d) parameters of 2-byte gradients.
  CHECK(s.parallel.bucket_mb == Approx(40e6 * 2 / (1 << 20)));
  CHECK(s.schedule == "interleaved");
  // The file reads back as the same scenario.
  CHECK(parse_scenario(got.yaml, "imported.yaml") == s);
  REQUIRE(!got.notes.empty());
  CHECK_THAT(got.notes[0], Contains("ffn-hidden-size 49152"));
  // --tp-comm-overlap is modelled (parallel.tp_comm_overlap), and the file keeps it.
  const MegatronImport overlap = import_megatron(split(kGpt3 + " --tp-comm-overlap"), gpus(1024));
  CHECK(overlap.scenario.parallel.tp_comm_overlap);
  CHECK(parse_scenario(overlap.yaml, "imported.yaml") == overlap.scenario);
  for (const auto& n : overlap.notes) CHECK_THAT(n, !Contains("tp-comm-overlap"));
}

TEST_CASE("megatron import: Llama-2 70B - GQA, SwiGLU, untied head noted, Megatron's defaults when left out",
          "[megatron][import]") {
  const std::string llama =
      "--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 --group-query-attention "
      "--num-query-groups 8 --swiglu --seq-length 4096 --micro-batch-size 1 --tensor-model-parallel-size 8 "
      "--pipeline-model-parallel-size 4 --vocab-size 32000 --untie-embeddings-and-output-weights --normalization "
      "RMSNorm --position-embedding-type rope --disable-bias-linear --bf16 --transformer-impl local";
  MegatronCluster c = gpus(0);
  c.nodes = 4;
  const MegatronImport got = import_megatron(split(llama), c);
  const Scenario& s = got.scenario;
  CHECK(s.model.kv_heads == 8);
  CHECK(s.model.mlp == "swiglu");
  CHECK(s.model.ffn == 28672);
  CHECK(s.model.vocab == 32768);
  CHECK(s.model.attention == "standard");  // the local transformer without --use-flash-attn
  CHECK(s.parallel.data == 1);
  CHECK(s.parallel.global_batch == 1);  // micro × d, as Megatron defaults it
  CHECK_FALSE(s.parallel.overlap_grad_reduce);  // off unless asked for, as in Megatron
  CHECK_FALSE(s.parallel.overlap_p2p);          // 1F1B without virtual stages waits for its p2p
  CHECK_FALSE(s.parallel.distributed_optimizer);
  CHECK(s.schedule == "1f1b");
  std::string notes;
  for (const auto& n : got.notes) notes += n + "\n";
  CHECK_THAT(notes, Contains("untie") && Contains("global-batch-size 1") && Contains("padded to 32768"));
  // --swiglu without --ffn-hidden-size: Megatron's ⌊(4h · 2/3) / 64⌋ · 64.
  const MegatronImport small = import_megatron(
      split("--num-layers 4 --hidden-size 4096 --num-attention-heads 32 --swiglu --seq-length 2048 "
            "--micro-batch-size 2 --vocab-size 32000"),
      gpus(8));
  CHECK(small.scenario.model.ffn == 10880);
  CHECK(small.scenario.parallel.data == 8);
}

TEST_CASE("megatron import: uneven first and last stages, block recompute of whole stages, = syntax",
          "[megatron][import]") {
  const MegatronImport got = import_megatron(
      split("--num-layers=30 --hidden-size=2048 --num-attention-heads=16 --seq-length=2048 --micro-batch-size=1 "
            "--global-batch-size=64 --pipeline-model-parallel-size=4 --decoder-first-pipeline-num-layers=6 "
            "--decoder-last-pipeline-num-layers=6 --recompute-granularity full --recompute-method block "
            "--recompute-num-layers 9 --vocab-size 50000 --fp16"),
      gpus(8));
  CHECK(got.scenario.parallel.layers_per_stage == std::vector<int>{6, 9, 9, 6});
  CHECK(got.scenario.parallel.recompute == Recompute::Full);
  CHECK(got.scenario.parallel.data == 2);
  CHECK(got.scenario.model.dtype == "fp16");
  CHECK(got.scenario.cluster.gpus() == 8);
  // fp16: Megatron's dynamic loss scaler, with its defaults.
  CHECK(got.scenario.parallel.loss_scale == 0);
  CHECK(got.scenario.parallel.initial_loss_scale == 4294967296.0);
  CHECK(got.scenario.parallel.min_loss_scale == 1);
  CHECK(got.scenario.parallel.loss_scale_window == 1000);
}

TEST_CASE("megatron import: the fp16 loss-scaler arguments", "[megatron][import]") {
  const std::string base =
      "--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
      "--global-batch-size 8 --vocab-size 50000 --fp16 ";
  const MegatronImport d = import_megatron(
      split(base + "--initial-loss-scale 65536 --min-loss-scale 0.25 --loss-scale-window 200 --hysteresis 2"), gpus(8));
  CHECK(d.scenario.parallel.loss_scale == 0);
  CHECK(d.scenario.parallel.initial_loss_scale == 65536);
  CHECK(d.scenario.parallel.min_loss_scale == 0.25);
  CHECK(d.scenario.parallel.loss_scale_window == 200);
  CHECK(import_megatron(split(base + "--loss-scale 1024"), gpus(8)).scenario.parallel.loss_scale == 1024);
  REQUIRE_THROWS_WITH(import_megatron(split(base + "--loss-scale -1"), gpus(8)),
                      Contains("--loss-scale: expected a positive number, got '-1'"));
  REQUIRE_THROWS_WITH(import_megatron(split(base + "--loss-scale-window 0"), gpus(8)),
                      Contains("--loss-scale-window: expected an integer ≥ 1, got '0'"));
}

TEST_CASE("megatron import: clear errors name the argument", "[megatron][import][bad-input]") {
  const std::string base =
      "--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
      "--vocab-size 50000 ";
  auto fails = [&](const std::string& extra, int n, const std::string& message) {
    INFO(extra);
    REQUIRE_THROWS_WITH(import_megatron(split(base + extra), gpus(n)), Contains(message));
  };
  fails("--no-such-flag", 8, "--no-such-flag is not an argument tdpipe knows");
  fails("--num-experts 8", 8, "--num-experts: mixture-of-experts layers are not modelled");
  fails("--context-parallel-size 2", 8, "--context-parallel-size: context parallelism is not modelled");
  fails("--tensor-model-parallel-size 3", 8, "= 3 does not divide the 8 GPUs");
  fails("--recompute-granularity full --recompute-method uniform --recompute-num-layers 2", 8,
        "tdpipe recomputes every layer");
  fails("--tensor-model-parallel-size two", 8, "--tensor-model-parallel-size: expected an integer ≥ 1, got 'two'");
  fails("--global-batch-size", 8, "--global-batch-size needs a value");
  fails("--swiglu=yes", 8, "--swiglu is a flag; it takes no value");
  fails("", 0, "the world size is not in Megatron's arguments");
  fails("--optimizer sgd", 8, "--optimizer sgd: tdpipe models Adam only");
  fails("--group-query-attention", 8, "--group-query-attention needs --num-query-groups");
  // The scenario's own checks, with the field: 3 micro-batch sequences do not split over d = 8.
  fails("--global-batch-size 3", 8, "parallel.global_batch");
  REQUIRE_THROWS_WITH(import_megatron(split("--num-layers 8 --hidden-size 1024"), gpus(8)),
                      Contains("--num-attention-heads is required"));
  REQUIRE_THROWS_WITH(import_megatron(split("stray --num-layers 8"), gpus(8)), Contains("unexpected 'stray'"));
  REQUIRE_THROWS_WITH(import_megatron(split("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length "
                                            "1024 --micro-batch-size 1 --tokenizer-type Llama2Tokenizer"),
                                      gpus(8)),
                      Contains("give --vocab-size N"));
}
