// megatron_import.cpp — Megatron-LM pretrain_gpt.py arguments → a scenario file.
//
// Megatron's own rules where it derives a value (megatron/training/arguments.py):
// data-parallel size = world / (tensor · pipeline · context); the vocabulary padded up to
// a multiple of make-vocab-size-divisible-by (128) · tensor; ffn-hidden-size 4·hidden, or
// ⌊(4·hidden·2/3) / 64⌋ · 64 with --swiglu; global batch micro · data when not given; the
// DDP bucket max(40 M, 1 M · data) parameters; overlap-grad-reduce and the distributed
// optimizer off unless asked for.
#include "tdpipe/ir/megatron_import.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#if TDPIPE_HAVE_YAML
#include <yaml-cpp/yaml.h>
#endif

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"

namespace tdpipe::ir {
namespace {

// Arguments tdpipe reads (a value, or a bare flag).
const std::set<std::string> kValued = {
    "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "num-query-groups", "seq-length",
    "micro-batch-size", "global-batch-size", "tensor-model-parallel-size", "pipeline-model-parallel-size",
    "context-parallel-size", "expert-model-parallel-size", "num-experts", "num-layers-per-virtual-pipeline-stage",
    "num-virtual-stages-per-pipeline-rank", "decoder-first-pipeline-num-layers",
    "decoder-last-pipeline-num-layers", "recompute-granularity", "recompute-method", "recompute-num-layers",
    "vocab-size", "make-vocab-size-divisible-by", "tokenizer-type", "ddp-bucket-size", "attention-backend",
    "transformer-impl", "fp8-format", "kv-channels", "optimizer", "loss-scale", "initial-loss-scale",
    "min-loss-scale", "loss-scale-window"};
const std::set<std::string> kFlags = {
    "swiglu", "group-query-attention", "sequence-parallel", "overlap-grad-reduce", "use-distributed-optimizer",
    "bf16", "fp16", "use-flash-attn", "recompute-activations", "checkpoint-activations",
    "accumulate-allreduce-grads-in-fp32", "untie-embeddings-and-output-weights", "overlap-param-gather",
    "tp-comm-overlap", "overlap-p2p-communication", "no-overlap-p2p-communication",
    "overlap-p2p-communication-warmup-flush", "moe-grouped-gemm"};
// Accepted and ignored: they do not change a step's time or memory.
const std::set<std::string> kIgnoredValued = {
    "data-path", "train-data-path", "valid-data-path", "test-data-path", "split", "vocab-file", "merge-file",
    "tokenizer-model", "save", "load", "save-interval", "log-interval", "eval-interval", "eval-iters",
    "train-iters", "train-samples", "lr", "min-lr", "lr-decay-style", "lr-decay-iters", "lr-decay-samples",
    "lr-warmup-iters", "lr-warmup-fraction", "lr-warmup-samples", "weight-decay", "clip-grad", "adam-beta1",
    "adam-beta2", "adam-eps", "init-method-std", "seed", "hidden-dropout", "attention-dropout",
    "distributed-backend", "tensorboard-dir", "tensorboard-log-interval", "tensorboard-queue-size",
    "wandb-project", "wandb-exp-name", "wandb-save-dir", "exit-interval", "exit-duration-in-mins",
    "data-cache-path", "num-workers", "rotary-base", "rotary-percent", "norm-epsilon", "hysteresis",
    "position-embedding-type",
    "normalization", "max-position-embeddings", "timing-log-level", "ckpt-format", "dataloader-type",
    "distributed-timeout-minutes"};
const std::set<std::string> kIgnoredFlags = {
    "use-mcore-models", "use-legacy-models", "no-masked-softmax-fusion", "no-bias-gelu-fusion",
    "no-bias-dropout-fusion", "no-gradient-accumulation-fusion", "no-async-tensor-model-parallel-allreduce",
    "use-rotary-position-embeddings", "disable-bias-linear", "log-throughput", "log-timers-to-tensorboard",
    "log-validation-ppl-to-tensorboard", "no-load-optim", "no-load-rng", "no-save-optim", "no-save-rng",
    "apply-layernorm-1p", "no-position-embedding", "manual-gc", "use-contiguous-buffers-in-local-ddp",
    "use-checkpoint-args", "exit-signal-handler", "log-params-norm", "log-num-zeros-in-grad", "use-cpu-initialization",
    "no-rope-fusion", "use-fused-rmsnorm", "barrier-with-L1-time", "eod-mask-loss"};

struct Args {
  std::map<std::string, std::string> value;  // the last value given
  std::set<std::string> flag;
  bool has(const std::string& k) const { return value.count(k) > 0 || flag.count(k) > 0; }
};

Args parse(const std::vector<std::string>& tokens) {
  Args a;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (t.rfind("--", 0) != 0 || t.size() == 2)
      throw Error(fmt::format("megatron: unexpected '{}' (a value without the --argument it belongs to)", t));
    std::string name = t.substr(2);
    std::optional<std::string> inline_value;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    std::replace(name.begin(), name.end(), '_', '-');
    const bool valued = kValued.count(name) || kIgnoredValued.count(name);
    const bool flag = kFlags.count(name) || kIgnoredFlags.count(name);
    if (!valued && !flag)
      throw Error(fmt::format("megatron: --{} is not an argument tdpipe knows: it reads the model, batch, parallel "
                              "layout, recompute, precision and overlap arguments of pretrain_gpt.py and ignores "
                              "data, optimizer-schedule, logging and checkpoint ones; drop it, or ask for it",
                              name));
    if (flag) {
      if (inline_value) throw Error(fmt::format("megatron: --{} is a flag; it takes no value (got '{}')", name, *inline_value));
      a.flag.insert(name);
      continue;
    }
    if (inline_value) {
      a.value[name] = *inline_value;
    } else {
      if (i + 1 >= tokens.size() || tokens[i + 1].rfind("--", 0) == 0)
        throw Error(fmt::format("megatron: --{} needs a value", name));
      a.value[name] = tokens[++i];
    }
  }
  return a;
}

long long integer(const Args& a, const std::string& name, long long lo = 1) {
  const std::string& v = a.value.at(name);
  long long out = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || ptr != v.data() + v.size() || out < lo || out > (1LL << 40))
    throw Error(fmt::format("megatron: --{}: expected an integer ≥ {}, got '{}'", name, lo, v));
  return out;
}
std::optional<long long> integer_if(const Args& a, const std::string& name, long long lo = 1) {
  if (!a.value.count(name)) return std::nullopt;
  return integer(a, name, lo);
}
long long required(const Args& a, const std::string& name) {
  if (!a.value.count(name)) throw Error(fmt::format("megatron: --{} is required (Megatron requires it too)", name));
  return integer(a, name);
}
// A positive real (a loss scale).
double real(const Args& a, const std::string& name) {
  const std::string& v = a.value.at(name);
  char* end = nullptr;
  const double out = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !(out > 0) || !std::isfinite(out))
    throw Error(fmt::format("megatron: --{}: expected a positive number, got '{}'", name, v));
  return out;
}
std::string text(const Args& a, const std::string& name, const std::string& def) {
  const auto it = a.value.find(name);
  return it == a.value.end() ? def : it->second;
}

}  // namespace

MegatronImport import_megatron(const std::vector<std::string>& tokens, const MegatronCluster& cluster) {
#if !TDPIPE_HAVE_YAML
  (void)tokens;
  (void)cluster;
  throw Error("megatron import writes a YAML scenario; this build has no yaml-cpp");
#else
  const Args a = parse(tokens);
  MegatronImport out;
  auto note = [&](std::string s) { out.notes.push_back(std::move(s)); };

  // Unsupported: what the cost model has no notion of.
  if (integer_if(a, "num-experts", 0).value_or(0) > 1)
    throw Error("megatron: --num-experts: mixture-of-experts layers are not modelled by tdpipe");
  if (integer_if(a, "expert-model-parallel-size").value_or(1) > 1)
    throw Error("megatron: --expert-model-parallel-size: expert parallelism is not modelled by tdpipe");
  if (integer_if(a, "context-parallel-size").value_or(1) > 1)
    throw Error("megatron: --context-parallel-size: context parallelism is not modelled by tdpipe (only 1)");
  if (a.value.count("fp8-format")) throw Error("megatron: --fp8-format: FP8 training is not modelled by tdpipe");
  if (const std::string opt = text(a, "optimizer", "adam"); opt != "adam")
    throw Error(fmt::format("megatron: --optimizer {}: tdpipe models Adam only", opt));

  const long long layers = required(a, "num-layers"), hidden = required(a, "hidden-size");
  const long long heads = required(a, "num-attention-heads"), seq = required(a, "seq-length");
  const long long micro = required(a, "micro-batch-size");
  const long long t = integer_if(a, "tensor-model-parallel-size").value_or(1);
  const long long p = integer_if(a, "pipeline-model-parallel-size").value_or(1);
  if (const auto kv = integer_if(a, "kv-channels"); kv && *kv * heads != hidden)
    throw Error(fmt::format("megatron: --kv-channels {}: tdpipe's attention has hidden / heads = {} channels per head",
                            *kv, hidden / heads));

  // The machine: world size from the cluster options.
  const long long per_node = cluster.gpus_per_node;
  if (per_node < 1) throw Error(fmt::format("megatron: --gpus-per-node: expected ≥ 1, got {}", per_node));
  const long long world = cluster.gpus > 0 ? cluster.gpus : static_cast<long long>(cluster.nodes) * per_node;
  if (world < 1) throw Error("megatron: the world size is not in Megatron's arguments: give --gpus N or --nodes N");
  if (world % (t * p) != 0)
    throw Error(fmt::format("megatron: --tensor-model-parallel-size {} × --pipeline-model-parallel-size {} = {} does "
                            "not divide the {} GPUs", t, p, t * p, world));
  const long long d = world / (t * p);
  long long nodes = world / per_node, gpus_per_node = per_node;
  if (world < per_node) {
    nodes = 1;
    gpus_per_node = world;
  } else if (world % per_node != 0) {
    throw Error(fmt::format("megatron: {} GPUs are not a whole number of nodes of {}", world, per_node));
  }

  // The model.
  const bool swiglu = a.flag.count("swiglu") > 0;
  long long ffn = 0;
  if (const auto f = integer_if(a, "ffn-hidden-size")) {
    ffn = *f;
  } else {
    ffn = swiglu ? static_cast<long long>((4 * hidden * 2 / 3) / 64) * 64 : 4 * hidden;
    note(fmt::format("ffn-hidden-size {} (Megatron's default{})", ffn, swiglu ? " with --swiglu" : ""));
  }
  long long kv_heads = 0;
  if (a.flag.count("group-query-attention")) {
    if (!a.value.count("num-query-groups"))
      throw Error("megatron: --group-query-attention needs --num-query-groups");
    kv_heads = integer(a, "num-query-groups");
  } else if (a.value.count("num-query-groups")) {
    note("--num-query-groups without --group-query-attention: ignored, as Megatron does");
  }
  long long vocab = 0;
  if (const auto v = integer_if(a, "vocab-size")) {
    vocab = *v;
  } else if (text(a, "tokenizer-type", "") == "GPT2BPETokenizer") {
    vocab = 50257;
  } else {
    throw Error(fmt::format("megatron: the vocabulary size comes from the tokenizer ({}), which tdpipe does not "
                            "read: give --vocab-size N",
                            text(a, "tokenizer-type", "none given")));
  }
  const long long multiple = integer_if(a, "make-vocab-size-divisible-by").value_or(128) * t;
  const long long padded = (vocab + multiple - 1) / multiple * multiple;
  if (padded != vocab) note(fmt::format("vocabulary {} padded to {} (a multiple of {}, as Megatron pads it)", vocab, padded, multiple));
  if (a.flag.count("bf16") && a.flag.count("fp16")) throw Error("megatron: --bf16 and --fp16 together");
  const std::string dtype = a.flag.count("bf16") ? "bf16" : a.flag.count("fp16") ? "fp16" : "fp32";
  const std::string impl = text(a, "transformer-impl", "transformer_engine");
  const std::string backend = text(a, "attention-backend", "auto");
  const bool flash = a.flag.count("use-flash-attn") || backend == "flash" || backend == "fused" ||
                     (backend == "auto" && impl == "transformer_engine");
  if (a.flag.count("untie-embeddings-and-output-weights"))
    note("--untie-embeddings-and-output-weights: not modelled (tdpipe's LM head shares the embedding: the head's "
         "own vocab·hidden/t parameters on the last stage are not counted)");

  // Virtual stages and uneven first/last stages.
  long long chunks = 1;
  if (const auto per = integer_if(a, "num-layers-per-virtual-pipeline-stage")) {
    if (layers % (p * *per) != 0)
      throw Error(fmt::format("megatron: --num-layers-per-virtual-pipeline-stage {}: {} layers are not p = {} ranks × "
                              "a whole number of such stages", *per, layers, p));
    chunks = layers / (p * *per);
  }
  if (const auto v = integer_if(a, "num-virtual-stages-per-pipeline-rank")) {
    if (a.value.count("num-layers-per-virtual-pipeline-stage") && *v != chunks)
      throw Error("megatron: --num-virtual-stages-per-pipeline-rank and --num-layers-per-virtual-pipeline-stage disagree");
    chunks = *v;
  }
  std::vector<long long> stage_layers;
  const auto first = integer_if(a, "decoder-first-pipeline-num-layers"), last = integer_if(a, "decoder-last-pipeline-num-layers");
  if (first || last) {
    if (chunks > 1) throw Error("megatron: uneven first/last pipeline stages with virtual stages: not modelled by tdpipe");
    if (p < 2) throw Error("megatron: --decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size ≥ 2");
    const long long given = first.value_or(0) + last.value_or(0);
    const long long middle_ranks = p - (first ? 1 : 0) - (last ? 1 : 0);
    const long long rest = layers - given;
    if (rest < 0 || (middle_ranks > 0 ? rest % middle_ranks != 0 : rest != 0))
      throw Error(fmt::format("megatron: --decoder-first/last-pipeline-num-layers leave {} layers for {} other stages: "
                              "not an even split", rest, middle_ranks));
    for (long long r = 0; r < p; ++r)
      stage_layers.push_back(r == 0 && first ? *first : r == p - 1 && last ? *last : rest / std::max(1LL, middle_ranks));
  }

  // Recompute.
  std::string recompute = "none";
  const std::string granularity = text(a, "recompute-granularity", a.flag.count("recompute-activations") ? "selective"
                                                                   : a.flag.count("checkpoint-activations") ? "full"
                                                                                                            : "none");
  if (granularity == "selective") {
    recompute = "selective";
  } else if (granularity == "full") {
    const std::string method = text(a, "recompute-method", "uniform");
    const long long n = integer_if(a, "recompute-num-layers").value_or(1);
    const long long per_stage = layers / std::max(1LL, p * chunks);
    if (method == "uniform" ? n != 1 : (method == "block" ? n < per_stage : true))
      throw Error(fmt::format("megatron: --recompute-method {} --recompute-num-layers {}: tdpipe recomputes every layer "
                              "(uniform with 1 layer per group, or block with all {} of a stage) or none",
                              method, n, per_stage));
    recompute = "full";
  } else if (granularity != "none") {
    throw Error(fmt::format("megatron: --recompute-granularity {}: expected full or selective", granularity));
  }

  // Batch, buckets, overlap.
  long long global = 0;
  if (const auto g = integer_if(a, "global-batch-size")) {
    global = *g;
  } else {
    global = micro * d;
    note(fmt::format("global-batch-size {} (Megatron's default: micro-batch × data-parallel size)", global));
  }
  const double grad_bytes = a.flag.count("accumulate-allreduce-grads-in-fp32") ? 4.0 : dtype == "fp32" ? 4.0 : 2.0;
  const double bucket_params = a.value.count("ddp-bucket-size") ? static_cast<double>(integer(a, "ddp-bucket-size"))
                                                                : std::max(40e6, 1e6 * static_cast<double>(d));
  if (a.flag.count("accumulate-allreduce-grads-in-fp32"))
    note("--accumulate-allreduce-grads-in-fp32: the buckets are sized in fp32, but tdpipe's reduction moves the "
         "model's dtype");
  if (a.flag.count("overlap-param-gather"))
    note("--overlap-param-gather: not modelled (the all-gathers follow OPT)");

  YAML::Emitter y;
  std::string given;
  for (const auto& tok : tokens) given += (given.empty() ? "" : " ") + tok;
  y << YAML::Comment(fmt::format("tdpipe import megatron --gpus {} --gpu {} -- {}", world, cluster.gpu, given));
  y << YAML::BeginMap;
  y << YAML::Key << "name" << YAML::Value << cluster.name;
  y << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "name" << YAML::Value << cluster.name;
  y << YAML::Key << "layers" << YAML::Value << layers;
  y << YAML::Key << "hidden" << YAML::Value << hidden;
  y << YAML::Key << "ffn" << YAML::Value << ffn;
  y << YAML::Key << "heads" << YAML::Value << heads;
  if (kv_heads > 0) y << YAML::Key << "kv_heads" << YAML::Value << kv_heads;
  y << YAML::Key << "seq" << YAML::Value << seq;
  y << YAML::Key << "vocab" << YAML::Value << padded;
  y << YAML::Key << "dtype" << YAML::Value << dtype;
  y << YAML::Key << "mlp" << YAML::Value << (swiglu ? "swiglu" : "gelu");
  y << YAML::Key << "attention" << YAML::Value << (flash ? "flash" : "standard");
  y << YAML::EndMap;
  y << YAML::Key << "cluster" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "gpu" << YAML::Value << cluster.gpu;
  y << YAML::Key << "nodes" << YAML::Value << nodes;
  y << YAML::Key << "gpus_per_node" << YAML::Value << gpus_per_node;
  y << YAML::EndMap;
  y << YAML::Key << "parallel" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "tensor" << YAML::Value << t;
  y << YAML::Key << "pipeline" << YAML::Value << p;
  y << YAML::Key << "data" << YAML::Value << d;
  y << YAML::Key << "chunks" << YAML::Value << chunks;
  y << YAML::Key << "micro_batch" << YAML::Value << micro;
  y << YAML::Key << "global_batch" << YAML::Value << global;
  y << YAML::Key << "recompute" << YAML::Value << recompute;
  y << YAML::Key << "sequence_parallel" << YAML::Value << (a.flag.count("sequence-parallel") > 0);
  if (!stage_layers.empty()) y << YAML::Key << "layers_per_stage" << YAML::Value << YAML::Flow << stage_layers;
  y << YAML::Key << "overlap_grad_reduce" << YAML::Value << (a.flag.count("overlap-grad-reduce") > 0);
  if (a.flag.count("tp-comm-overlap")) y << YAML::Key << "tp_comm_overlap" << YAML::Value << true;
  // Pipeline p2p beside compute: Megatron-LM overlaps it in the interleaved schedule unless
  // --no-overlap-p2p-communication (older releases: only with --overlap-p2p-communication);
  // its non-interleaved 1F1B waits for each p2p batch.
  const bool overlap_p2p = a.flag.count("no-overlap-p2p-communication")
                               ? false
                               : chunks > 1 || a.flag.count("overlap-p2p-communication") > 0;
  y << YAML::Key << "overlap_p2p" << YAML::Value << overlap_p2p;
  y << YAML::Key << "bucket_mb" << YAML::Value << bucket_params * grad_bytes / (1024.0 * 1024.0);
  y << YAML::Key << "distributed_optimizer" << YAML::Value << (a.flag.count("use-distributed-optimizer") > 0);
  if (dtype == "fp16") {
    // Megatron's loss scaler: --loss-scale static, else dynamic from --initial-loss-scale
    // (2^32), halved on overflow down to --min-loss-scale (1), doubled after
    // --loss-scale-window (1000) good steps. (--hysteresis, overflows tolerated before a
    // halving, has no counterpart: tdpipe halves at the first.)
    if (a.value.count("loss-scale")) y << YAML::Key << "loss_scale" << YAML::Value << real(a, "loss-scale");
    y << YAML::Key << "initial_loss_scale" << YAML::Value
      << (a.value.count("initial-loss-scale") ? real(a, "initial-loss-scale") : 4294967296.0);
    y << YAML::Key << "min_loss_scale" << YAML::Value
      << (a.value.count("min-loss-scale") ? real(a, "min-loss-scale") : 1.0);
    y << YAML::Key << "loss_scale_window" << YAML::Value << integer_if(a, "loss-scale-window").value_or(1000);
  }
  y << YAML::EndMap;
  y << YAML::Key << "schedule" << YAML::Value << (chunks > 1 ? "interleaved" : "1f1b");
  y << YAML::EndMap;
  if (!y.good()) throw Error(std::string("megatron: writing the scenario: ") + y.GetLastError());
  out.yaml = std::string(y.c_str()) + "\n";
  out.scenario = parse_scenario(out.yaml, cluster.name + ".yaml");
  return out;
#endif
}

}  // namespace tdpipe::ir
