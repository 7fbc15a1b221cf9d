// test_runtime.cpp — the runtime's failure behaviour (watchdog naming blocked ranks,
// a throwing rank stopping the run), its measured trace, and real training.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <map>
#include <set>
#include <tuple>

#include <sched.h>

#include <catch2/catch.hpp>

#include "exec_test_util.hpp"
#include "tdpipe/exec/cpu/calibrate.hpp"
#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/traces/chrome_json.hpp"

#include <nlohmann/json.hpp>
#include "tdpipe/exec/interpreter.hpp"
#include "tdpipe/exec/launch_common.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec {
namespace {

using ir::Op;
using ir::OpKind;
using ir::Stream;

Op compute(OpKind kind, int mb) {
  Op o;
  o.kind = kind;
  o.mb = mb;
  o.stream = Stream::Compute;
  return o;
}
Op p2p(OpKind kind, OpKind payload, int mb, int peer) {
  Op o;
  o.kind = kind;
  o.payload = payload;
  o.mb = mb;
  o.peer = peer;
  o.stream = Stream::P2P;
  return o;
}

// A hand-lowered 2-stage plan of one micro-batch; ops are filled by the test.
ir::Plan two_stage_plan() {
  ir::Plan plan;
  plan.schedule = "handmade";
  plan.stages = 2;
  plan.microbatches = 1;
  plan.lowered = true;
  plan.stage_of = {{0}, {1}};
  plan.scenario = test::small_scenario(2, 1, 1, 1);
  plan.ranks.resize(2);
  return plan;
}

cpu::CpuRunOptions quick(double watchdog_seconds) {
  cpu::CpuRunOptions o;
  o.train = test::train_options(1);
  o.watchdog_seconds = watchdog_seconds;
  return o;
}

/// Runs a plan that must fail: its error message and how long it took to fail.
std::pair<std::string, double> run_failing(const ir::Plan& plan, const cpu::CpuRunOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string message;
  try {
    cpu::run_cpu(plan, opt);
  } catch (const Error& e) {
    message = e.what();
  }
  return {message, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

}  // namespace

TEST_CASE("a hand-lowered plan trains like the reference", "[exec][runtime]") {
  ir::Plan plan = two_stage_plan();
  plan.ranks[0] = {compute(OpKind::F, 0), p2p(OpKind::SEND, OpKind::F, 0, 1),
                   p2p(OpKind::RECV, OpKind::B, 0, 1), compute(OpKind::BW, 0), compute(OpKind::OPT, -1)};
  plan.ranks[1] = {p2p(OpKind::RECV, OpKind::F, 0, 0), compute(OpKind::F, 0), compute(OpKind::BW, 0),
                   p2p(OpKind::SEND, OpKind::B, 0, 0), compute(OpKind::OPT, -1)};
  auto opt = quick(30);
  opt.train.steps = 2;
  const auto got = cpu::run_cpu(plan, opt);
  const auto ref = cpu::run_reference(plan.scenario, 1, 1, opt.train);
  REQUIRE(got.loss_per_step.size() == 2);
  CHECK(got.loss_per_step[1] == Approx(ref.loss_per_step[1]).epsilon(1e-12));
  std::string worst;
  CHECK(test::max_rel_error(got.weights, ref.weights, &worst) < 1e-12);
}

TEST_CASE("the watchdog names every blocked rank, its op and its peer", "[exec][runtime]") {
  // Both ranks post their RECV before the SEND the peer waits for: NCCL would hang.
  ir::Plan plan = two_stage_plan();
  plan.ranks[0] = {p2p(OpKind::RECV, OpKind::B, 0, 1), compute(OpKind::F, 0),
                   p2p(OpKind::SEND, OpKind::F, 0, 1), compute(OpKind::BW, 0)};
  plan.ranks[1] = {p2p(OpKind::RECV, OpKind::F, 0, 0), compute(OpKind::F, 0), compute(OpKind::BW, 0),
                   p2p(OpKind::SEND, OpKind::B, 0, 0)};
  // The same report whether each stream has its thread, the rank's thread runs them all,
  // or one thread takes turns between both ranks.
  for (const auto& [runtime, threads, name] : {std::tuple{Runtime::cooperative, 2, "cooperative"},
                                               std::tuple{Runtime::cooperative, 1, "cooperative, one thread"},
                                               std::tuple{Runtime::threaded, 2, "threaded"}}) DYNAMIC_SECTION(name) {
    auto opt = quick(0.3);
    opt.runtime = runtime;
    opt.rank_threads = threads;
    const auto [message, waited] = run_failing(plan, opt);
    INFO(message);
    CHECK_THAT(message, Catch::Contains("watchdog"));
    CHECK_THAT(message, Catch::Contains("rank 0 (p2p stream): RECV(B0<r1) blocked in transport, "
                                        "waiting for peer rank 1"));
    CHECK_THAT(message, Catch::Contains("rank 1 (p2p stream): RECV(F0<r0) blocked in transport, "
                                        "waiting for peer rank 0"));
    CHECK_THAT(message, Catch::Contains("rank 1 (compute stream): F0 waiting for the activation of mb 0 "
                                        "slice 0 from virtual stage 0"));
    CHECK(waited < 10.0);
  }
}

TEST_CASE("a time limit fires once past its deadline and never after it is destroyed", "[exec][runtime]") {
  std::atomic<int> fired{0};
  const auto t0 = std::chrono::steady_clock::now();
  {
    TimeLimit limit(0.05, [&] { ++fired; });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  CHECK(fired == 1);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(300));
  {
    TimeLimit limit(30, [&] { ++fired; });  // the call it guards returned in time
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(fired == 1);
  // Destroying a limit does not wait for its deadline.
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("a rank that throws stops the run with its error, no hang", "[exec][runtime]") {
  ir::Plan plan = two_stage_plan();
  plan.ranks[0] = {compute(OpKind::F, 0), p2p(OpKind::SEND, OpKind::F, 0, 1),
                   p2p(OpKind::RECV, OpKind::B, 0, 1), compute(OpKind::BW, 0)};
  // Rank 1 runs a micro-batch the plan does not have: its compute throws while
  // rank 0 sits in RECV waiting for a gradient that will never come.
  plan.ranks[1] = {p2p(OpKind::RECV, OpKind::F, 0, 0), compute(OpKind::F, 0), compute(OpKind::BW, 7),
                   p2p(OpKind::SEND, OpKind::B, 0, 0)};
  for (int threads : {2, 1}) DYNAMIC_SECTION(threads << " rank threads") {
    auto opt = quick(60);
    opt.rank_threads = threads;
    const auto [message, waited] = run_failing(plan, opt);
    INFO(message);
    CHECK_THAT(message, Catch::StartsWith("rank 1 (compute stream) failed in BW7: "));
    CHECK_THAT(message, Catch::Contains("micro-batch 7 out of range (m = 1)"));
    CHECK(waited < 5.0);  // ended by the failure, not by the 60 s watchdog
  }
}

TEST_CASE("ranks sharing a thread take turns: one thread runs 4 stages and 2 replicas, ops never overlap",
          "[exec][runtime]") {
  const ir::Scenario sc = test::small_scenario(4, 2, 8, 1);
  const auto built = planner::build_plan(sc, "1f1b", 1);
  const cpu::RunResult ref = cpu::run_reference(sc, 2, 8, test::train_options(2));
  for (int threads : {1, 3}) DYNAMIC_SECTION(threads << " threads for 8 ranks") {
    cpu::CpuRunOptions opt;
    opt.train = test::train_options(2);
    opt.rank_threads = threads;
    const cpu::RunResult got = cpu::run_cpu(built.lowered, opt);
    CHECK(got.trace.metadata.at("rank_threads") == std::to_string(threads));
    for (int s = 0; s < 2; ++s) CHECK(std::abs(got.loss_per_step[s] - ref.loss_per_step[s]) <= 1e-5 * ref.loss_per_step[s]);
    CHECK(test::max_rel_error(got.weights, ref.weights, nullptr) <= 1e-5);
    CHECK(got.replica_divergence == 0.0);
    // The compute-stream ops of the ranks of one thread never run at the same time (their
    // p2p batches may: they are in flight while an op runs).
    const auto groups = cpu::rank_groups(8, threads);
    for (const auto& group : groups) {
      std::vector<std::pair<std::int64_t, std::int64_t>> spans;
      for (const auto& e : got.trace.events)
        if (e.stream == static_cast<int>(Stream::Compute) &&
            std::find(group.begin(), group.end(), e.rank) != group.end())
          spans.push_back({e.start_ns, e.end_ns()});
      std::sort(spans.begin(), spans.end());
      REQUIRE(spans.size() > group.size());
      for (std::size_t k = 1; k < spans.size(); ++k) CHECK(spans[k].first >= spans[k - 1].second);
    }
  }
}

TEST_CASE("rank threads: contiguous blocks, and counts a run cannot use are refused", "[exec][runtime]") {
  CHECK(cpu::rank_groups(4, 2) == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  CHECK(cpu::rank_groups(5, 2) == std::vector<std::vector<int>>{{0, 1, 2}, {3, 4}});
  CHECK(cpu::rank_groups(3, 3) == std::vector<std::vector<int>>{{0}, {1}, {2}});
  CHECK_THROWS_WITH(cpu::rank_groups(2, 3), Catch::Contains("3 threads for 2 ranks"));
  const auto built = planner::build_plan(test::small_scenario(2, 1, 4, 1), "1f1b", 1);
  cpu::CpuRunOptions opt;
  opt.train = test::train_options(1);
  opt.rank_threads = 3;
  CHECK_THROWS_WITH(cpu::run_cpu(built.lowered, opt), Catch::Contains("rank threads = 3: the run has 2 ranks"));
  opt.rank_threads = 1;
  opt.runtime = Runtime::threaded;
  CHECK_THROWS_WITH(cpu::run_cpu(built.lowered, opt), Catch::Contains("the threaded runtime gives each stream"));
  opt.runtime = Runtime::cooperative;
  opt.faults.inject = {parse_fault_spec("slow:rank=1,step=0,factor=2")};
  CHECK_THROWS_WITH(cpu::run_cpu(built.lowered, opt), Catch::Contains("an injected slow fault holds its rank's thread"));
  // A dropped transfer is retried inside the transport's test: ranks may share a thread.
  opt.faults.inject = {parse_fault_spec("drop:rank=0,peer=1,step=0")};
  CHECK(cpu::rank_thread_count(built.lowered, opt) == 1);
  opt.faults.inject.clear();
  opt.train.rank_speed = {1, 0.5};
  CHECK_THROWS_WITH(cpu::run_cpu(built.lowered, opt), Catch::Contains("--rank-speed stretches a rank's ops"));
  opt.train.rank_speed.clear();
  ir::Scenario fp16 = test::small_scenario(2, 1, 4, 1);
  fp16.model.dtype = "fp16";
  const auto half = planner::build_plan(fp16, "1f1b", 1);
  CHECK_THROWS_WITH(cpu::run_cpu(half.lowered, opt), Catch::Contains("fp16 training agrees on overflow flags"));

  // Automatic, on one core: ranks share it unless one needs a thread of its own.
  cpu_set_t before;
  REQUIRE(sched_getaffinity(0, sizeof(before), &before) == 0);
  const std::vector<int> cores = cpu::allowed_cores();
  REQUIRE(!cores.empty());
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cores.front(), &one);
  REQUIRE(sched_setaffinity(0, sizeof(one), &one) == 0);
  opt.rank_threads = 0;
  const int fp32_threads = cpu::rank_thread_count(built.lowered, opt);
  const int fp16_threads = cpu::rank_thread_count(half.lowered, opt);
  opt.train.rank_speed = {1, 0.5};
  const int slow_threads = cpu::rank_thread_count(built.lowered, opt);
  opt.train.rank_speed.clear();
  opt.runtime = Runtime::threaded;
  const int threaded_threads = cpu::rank_thread_count(built.lowered, opt);
  REQUIRE(sched_setaffinity(0, sizeof(before), &before) == 0);
  CHECK(fp32_threads == 1);
  CHECK(fp16_threads == 2);
  CHECK(slow_threads == 2);
  CHECK(threaded_threads == 2);
}

TEST_CASE("a SEND matched with a RECV of another tensor is an error naming both", "[exec][runtime]") {
  ir::Plan plan = two_stage_plan();
  plan.microbatches = 2;
  plan.scenario = test::small_scenario(2, 1, 2, 1);
  plan.ranks[0] = {compute(OpKind::F, 0), compute(OpKind::F, 1), p2p(OpKind::SEND, OpKind::F, 1, 1)};
  plan.ranks[1] = {p2p(OpKind::RECV, OpKind::F, 0, 0)};
  std::string message;
  try {
    cpu::run_cpu(plan, quick(30));
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("SEND(F1>r1)") && Catch::Contains("RECV(F0<r0)") &&
                          Catch::Contains("k-th SEND"));
}

TEST_CASE("measured trace: every op once, streams in plan order, data before use", "[exec][trace]") {
  const ir::Scenario sc = test::small_scenario(2, 2, 4, 1);
  for (const char* schedule : {"1f1b", "zb-h1"}) {
    INFO(schedule);
    const auto built = planner::build_plan(sc, schedule, 1);
    cpu::CpuRunOptions opt;
    opt.train = test::train_options(2);
    const auto r = cpu::run_cpu(built.lowered, opt);
    const traces::Trace& t = r.trace;
    CHECK(t.origin == "cpu");
    CHECK(t.schedule == schedule);
    CHECK(t.ranks == 4);
    CHECK(t.metadata.at("backend") == "cpu");
    CHECK(t.metadata.at("trace_step") == "1");
    std::size_t ops = 0;
    for (const auto& rank : built.lowered.ranks) ops += rank.size();
    REQUIRE(t.events.size() == 2 * ops);
    std::int64_t first = t.events.front().start_ns;
    std::map<std::pair<int, int>, std::vector<const traces::TraceEvent*>> by_stream;
    std::map<std::tuple<int, int>, std::int64_t> recv_end;  // (world rank, mb) of F RECV
    for (const auto& e : t.events) {
      first = std::min(first, e.start_ns);
      CHECK(e.dur_ns >= 0);
      REQUIRE(e.kind.has_value());
      // The balancer's input: how much of each F/B/W ran in decoder layers (every
      // stage here holds one; OPT and transfers have none).
      if (ir::is_chunk_work(*e.kind))
        CHECK((e.layers_ns > 0 && e.layers_ns <= e.dur_ns));
      else
        CHECK(e.layers_ns == -1);
      by_stream[{e.rank, e.stream}].push_back(&e);
      if (*e.kind == OpKind::RECV && e.name.rfind("RECV(F", 0) == 0) recv_end[{e.rank, e.mb}] = e.end_ns();
    }
    CHECK(first == 0);
    for (const auto& [key, events] : by_stream) {
      const int w = key.first, p = built.lowered.stages;
      std::vector<const Op*> plan_ops;
      for (const auto& op : built.lowered.ranks[static_cast<std::size_t>(w % p)])
        if (static_cast<int>(op.stream) == key.second) plan_ops.push_back(&op);
      REQUIRE(events.size() == plan_ops.size());
      // Plan order; the ops of one batch start together and each ends when its own pair
      // completed; the stream's next op starts once the whole batch (or op) ended.
      std::int64_t before = events.front()->end_ns();
      for (std::size_t i = 1; i < events.size(); ++i) {
        const bool same_batch = plan_ops[i]->batch >= 0 && plan_ops[i]->batch == plan_ops[i - 1]->batch;
        if (same_batch) {
          CHECK(events[i]->start_ns == events[i - 1]->start_ns);
          before = std::max(before, events[i]->end_ns());
        } else {
          CHECK(events[i]->start_ns >= before);
          before = events[i]->end_ns();
        }
      }
    }
    // Stage 1's forward never starts before its input arrived.
    for (const auto& e : t.events)
      if (*e.kind == OpKind::F && e.rank % 2 == 1) CHECK(e.start_ns >= recv_end.at({e.rank, e.mb}));
  }
}

TEST_CASE("the tiny scenario learns: loss falls clearly in 200 steps", "[exec][train]") {
  ir::Scenario sc = ir::load_scenario(test::source_path("scenarios/tiny-gpt-cpu.yaml"));
  const auto built = planner::build_plan(sc, "1f1b", 1);
  cpu::CpuRunOptions opt;
  opt.train = test::train_options(200);
  opt.train.adam.lr = 3e-3;
  const auto r = cpu::run_cpu(built.lowered, opt);
  REQUIRE(r.loss_per_step.size() == 200);
  const double first = r.loss_per_step.front();
  double last10 = 0;
  for (int i = 190; i < 200; ++i) last10 += r.loss_per_step[static_cast<std::size_t>(i)] / 10;
  INFO("first " << first << " last-10 mean " << last10);
  // Uniform over the 96-entry vocabulary starts near ln 96 ≈ 4.56; the 29 characters
  // of the corpus have a unigram entropy near 2.9 nats; bigram structure goes below.
  CHECK(first == Approx(std::log(96.0)).epsilon(0.05));
  CHECK(last10 < 2.5);
}

}  // namespace tdpipe::exec

namespace tdpipe::exec {

TEST_CASE("the measured trace survives the Chrome-trace round trip", "[exec][trace]") {
  const auto built = planner::build_plan(test::small_scenario(2, 1, 4, 1), "tdpipe", 2);
  cpu::CpuRunOptions opt;
  opt.train = test::train_options(1);
  const auto r = cpu::run_cpu(built.lowered, opt);
  const traces::Trace back = traces::trace_from_chrome_json(traces::to_chrome_json(r.trace), "roundtrip");
  CHECK(back.origin == "cpu");
  CHECK(back.ranks == 2);
  REQUIRE(back.events.size() == r.trace.events.size());
  // Chrome traces carry µs; our ns survive to the µs (the format's resolution) at least.
  std::multiset<std::tuple<int, int, std::string>> want, got;
  for (const auto& e : r.trace.events) want.insert({e.rank, e.stream, e.name});
  for (const auto& e : back.events) got.insert({e.rank, e.stream, e.name});
  CHECK(got == want);
  CHECK(back.metadata.at("backend") == "cpu");
}

TEST_CASE("calibration measures every op kind per virtual stage and the transport", "[exec][calibrate]") {
  const ir::Scenario sc = test::small_scenario(2, 1, 4, 1);
  cpu::CalibrateOptions opt;
  opt.train = test::train_options(1);
  opt.warmup_steps = 1;
  opt.steps = 2;
  opt.transport_repeats = 20;
  const traces::Profile prof = cpu::calibrate(
      std::vector<ir::Plan>{planner::build_plan(sc, "1f1b", 1).lowered, planner::build_plan(sc, "zb-h1", 1).lowered},
      opt);
  CHECK(prof.stages == 2);
  CHECK(prof.platform.backend == "cpu");
  CHECK(prof.platform.ranks == 2);
  CHECK(prof.platform.cores >= 1);
  CHECK(prof.metadata.at("schedule") == "1f1b+zb-h1");
  std::map<std::pair<ir::OpKind, int>, traces::ProfileOp> ops;
  for (const auto& op : prof.ops) ops[{op.kind, op.virtual_stage}] = op;
  for (int stage : {0, 1})
    for (ir::OpKind k : {ir::OpKind::F, ir::OpKind::B, ir::OpKind::W, ir::OpKind::BW, ir::OpKind::OPT}) {
      INFO(ir::to_string(k) << " stage " << stage);
      REQUIRE(ops.count({k, stage}) == 1);
      const auto& op = ops.at({k, stage});
      CHECK(op.seconds > 0);
      CHECK(op.layers == 4);  // 8 layers over 2 stages
      // m = 4 micro-batches × 2 measured steps; OPT once per step.
      CHECK(op.samples == (k == ir::OpKind::OPT ? 2 : 8));
    }
  CHECK(prof.p2p.latency_seconds > 0);
  CHECK(prof.p2p.bytes_per_second > 0);
  CHECK(prof.collective.latency_seconds > 0);
  // The p2p latency is the one fitted from the run's own hand-offs (1f1b, p = 2, m = 4:
  // clean hand-offs in each of the 2 measured steps); the ping-pong's is kept aside.
  REQUIRE(prof.metadata.count("p2p_latency_samples") == 1);
  CHECK(std::stoi(prof.metadata.at("p2p_latency_samples")) >= 3);
  CHECK(std::stod(prof.metadata.at("p2p_latency_microbenchmark_seconds")) > 0);
  // Every step's trace lies inside its wall-clock step, so the medians keep that order.
  const double span = std::stod(prof.metadata.at("median_trace_iteration_seconds"));
  CHECK(span > 0);
  CHECK(span <= std::stod(prof.metadata.at("median_iteration_seconds")));
  CHECK(prof.platform.shared_capacity == prof.platform.cores);
}

}  // namespace tdpipe::exec

namespace tdpipe::exec {
namespace {

// One replica's rank of a p = 1, d = 2 plan, over a compute that reports its last
// backward's gradients final part by part and a transport that only counts the
// reductions it is asked for: what the dp stream does while that op still runs.
struct ProbeTransport final : Transport {
  std::mutex m;
  std::condition_variable cv;
  int started = 0;
  void post(std::span<P2POp>) override {}
  void all_reduce(const Buffer&, int) override {
    std::lock_guard lock(m);
    ++started;
    cv.notify_all();
  }
  void reduce_scatter(const Buffer& b, int tag) override { all_reduce(b, tag); }
  void all_gather(const Buffer&, int) override {}
  std::pair<int, int> dp_member() const override { return {0, 2}; }
  // Reductions started within `wait` (returns as soon as `want` have).
  int started_within(std::chrono::milliseconds wait, int want) {
    std::unique_lock lock(m);
    cv.wait_for(lock, wait, [&] { return started >= want; });
    return started;
  }
};

struct ProbeCompute final : Compute {
  static constexpr std::int64_t kTotal = 1000;  // the chunk's gradient elements, as reported
  ProbeTransport* transport = nullptr;
  int buckets = 0;
  bool overlap = true;    // expected: waits for every bucket only then
  std::vector<int> seen;  // reductions started after each report
  void begin_step(int) override {}
  Buffer run(const ComputeOp& op, Buffer) override {
    if (!op.progress) return {};
    // Bucket 0 is the chunk's last part: report exactly it final, then everything.
    const std::int64_t first = part_range(kTotal, buckets - 1, buckets).first;
    (*op.progress)(kTotal - first, kTotal);
    seen.push_back(transport->started_within(std::chrono::milliseconds(300), 1));
    seen.push_back(transport->started_within(std::chrono::milliseconds(300), 2));  // must stay 1
    (*op.progress)(kTotal, kTotal);
    seen.push_back(transport->started_within(overlap ? std::chrono::milliseconds(10000) : std::chrono::milliseconds(300),
                                             buckets - 1));
    return {};
  }
  Buffer allocate(const TensorKey&) override { return cpu::host_buffer(1); }
  Buffer grad_bucket(int, int, int) override { return cpu::host_buffer(1); }
  Buffer param_bucket(int, int, int) override { return cpu::host_buffer(1); }
  double end_step() override { return 0; }
};

}  // namespace

TEST_CASE("a bucket starts on the dp stream once its part is final - while the chunk's last backward still runs",
          "[exec][runtime][overlap]") {
  for (const bool overlap : {true, false}) {
    INFO("overlap_grad_reduce " << overlap);
    ir::Scenario sc = test::small_scenario(1, 2, 2, 1);
    sc.parallel.bucket_mb = 0.004;
    sc.parallel.overlap_grad_reduce = overlap;
    const ir::Plan plan = planner::build_plan(sc, "1f1b").lowered;
    int buckets = 0;
    for (const Op& op : plan.ranks[0]) buckets += op.kind == OpKind::ALLREDUCE;
    REQUIRE(buckets >= 3);
    ProbeTransport transport;
    ProbeCompute compute;
    compute.transport = &transport;
    compute.buckets = buckets;
    compute.overlap = overlap;
    cpu::CpuClock clock(std::chrono::steady_clock::now());
    RunControl control;
    const RankStepResult r = run_rank_step(plan, 0, 0, 0, Backend{&compute, &transport, &clock}, control);
    if (overlap) {
      // Bucket 0 alone once its part was final, then every one the plan lets start inside
      // the op: all but the last (ready_after 1: the chunk's first parameters, at its end).
      CHECK(compute.seen == std::vector<int>{1, 1, buckets - 1});
    } else {
      // Without overlap nothing starts before the rank's last backward has ended.
      REQUIRE(compute.seen.size() == 3);
      CHECK(compute.seen[0] == 0);
      CHECK(compute.seen[2] == 0);
    }
    std::int64_t last_bw_end = 0, first_reduce = -1;
    for (const auto& e : r.events) {
      if (e.kind == OpKind::BW) last_bw_end = std::max(last_bw_end, e.end_ns());
      if (e.kind == OpKind::ALLREDUCE && first_reduce < 0) first_reduce = e.start_ns;
    }
    CHECK(transport.started == buckets);
    if (overlap)
      CHECK(first_reduce < last_bw_end);
    else
      CHECK(first_reduce >= last_bw_end);
  }
}

}  // namespace tdpipe::exec

TEST_CASE("parameter offload trains bit-identically with a measured device peak of two layer blocks",
          "[exec][offload]") {
  // 8 layers on 2 stages: 4 blocks per rank of 2,176 parameters (hidden 16, ffn 32), the
  // embedding (768) on rank 0, the head (576) on rank 1; weights + two Adam moments,
  // 8 bytes each. Offload keeps two blocks on the device: the window the plan streams.
  using namespace tdpipe;
  constexpr std::int64_t kBlock = 2176, kBytes = 3 * 8;
  const std::int64_t ends[2] = {768, 576};
  for (const auto& [schedule, d] : std::vector<std::pair<std::string, int>>{{"1f1b", 1}, {"zb-h1", 1}, {"interleaved", 1}, {"1f1b", 2}}) {
    SECTION(schedule + " d=" + std::to_string(d)) {
      ir::Scenario sc = exec::test::small_scenario(2, d, 4, 1);
      exec::cpu::CpuRunOptions opt;
      opt.train = exec::test::train_options(3);
      const exec::cpu::RunResult ref = exec::cpu::run_cpu(planner::build_plan(sc, schedule).lowered, opt);
      sc.parallel.param_offload = "layers";
      const ir::Plan plan = planner::build_plan(sc, schedule).lowered;
      const exec::cpu::RunResult got = exec::cpu::run_cpu(plan, opt);
      REQUIRE(got.loss_per_step == ref.loss_per_step);  // the same arithmetic, bit for bit
      CHECK(got.weights == ref.weights);
      CHECK(got.grads == ref.grads);
      REQUIRE(got.param_state_peak_bytes.size() == static_cast<std::size_t>(2 * d));
      for (int w = 0; w < 2 * d; ++w) {
        INFO("world rank " << w);
        CHECK(ref.param_state_peak_bytes[static_cast<std::size_t>(w)] == (ends[w % 2] + 4 * kBlock) * kBytes);
        CHECK(got.param_state_peak_bytes[static_cast<std::size_t>(w)] == (ends[w % 2] + 2 * kBlock) * kBytes);
      }
      // Every copy ran, on the copy stream, and shows in the measured trace.
      std::size_t copies = 0, events = 0;
      for (const auto& op : plan.ranks[0]) copies += op.stream == ir::Stream::Copy;
      for (const auto& e : got.trace.events) events += e.rank == 0 && e.stream == static_cast<int>(ir::Stream::Copy);
      CHECK(copies > 0);
      CHECK(events == copies);
    }
  }
}

TEST_CASE("parameter offload: a plan whose op lacks a LOAD, or lists another block, is refused by name",
          "[exec][offload]") {
  using namespace tdpipe;
  ir::Scenario sc = exec::test::small_scenario(2, 1, 2, 1);
  sc.parallel.param_offload = "layers";
  exec::cpu::CpuRunOptions opt;
  opt.train = exec::test::train_options(1);
  opt.watchdog_seconds = 5;
  const ir::Plan good = planner::build_plan(sc, "1f1b").lowered;
  // The first F of rank 0 without its last LOAD: it would use a block no LOAD brought.
  ir::Plan fewer = good;
  for (ir::Op& op : fewer.ranks[0])
    if (op.kind == ir::OpKind::F) {
      for (auto it = op.deps.end(); it != op.deps.begin();) {
        --it;
        if (fewer.ranks[0][static_cast<std::size_t>(it->index)].kind == ir::OpKind::LOAD) {
          op.deps.erase(it);
          break;
        }
      }
      break;
    }
  CHECK_THROWS_WITH(exec::cpu::run_cpu(fewer, opt),
                    Catch::Contains("F0") && Catch::Contains("asked for its block 3 but the plan lists 3 LOADs"));
  // Its second LOAD brings layer 2 instead of layer 1.
  ir::Plan swapped = good;
  for (ir::Op& op : swapped.ranks[0])
    if (op.kind == ir::OpKind::LOAD && op.tag == 1) {
      op.tag = 2;
      break;
    }
  CHECK_THROWS_WITH(exec::cpu::run_cpu(swapped, opt),
                    Catch::Contains("uses chunk 0 layer 1 as its block 1, but the plan's LOAD 1 of it brings chunk 0 layer 2"));
}
