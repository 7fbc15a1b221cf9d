// test_rendezvous.cpp — the loopback transport's matching order (NCCL semantics), on CPU.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>
#include <vector>

#include "tdpipe/exec/cuda/rendezvous.hpp"

using namespace tdpipe::exec::cuda;
using tdpipe::ir::OpKind;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {
// A "copy" that records which send met which receive.
struct Side { int id; };
using R = Rendezvous<Side, Side, std::pair<int, int>>;
R make() { return R([](const Side& s, const Side& r) { return std::pair{s.id, r.id}; }); }
MessageKey act(int mb, int slice = 0) { return {OpKind::F, 0, mb, slice, 64}; }
}  // namespace

TEST_CASE("sends and receives of one pair match in posting order, either side first", "[loopback]") {
  R rv = make();
  auto s0 = rv.post_send(0, 1, act(0), {10});
  auto s1 = rv.post_send(0, 1, act(1), {11});
  CHECK_FALSE(s0->done());
  auto r0 = rv.post_recv(0, 1, act(0), {20});
  auto r1 = rv.post_recv(0, 1, act(1), {21});
  CHECK(s0->wait(100ms) == std::pair{10, 20});
  CHECK(r0->wait(100ms) == std::pair{10, 20});
  CHECK(s1->wait(100ms) == std::pair{11, 21});
  CHECK(r1->wait(100ms) == std::pair{11, 21});
  // Receive posted before the send.
  auto r2 = rv.post_recv(0, 1, act(2), {22});
  CHECK_FALSE(r2->done());
  auto s2 = rv.post_send(0, 1, act(2), {12});
  CHECK(r2->wait(100ms) == std::pair{12, 22});
  CHECK(rv.pending().empty());
}

TEST_CASE("directions are independent queues", "[loopback]") {
  R rv = make();
  // Rank 0 sends an activation to 1 while 1 sends a gradient to 0 (one batch each).
  MessageKey grad{OpKind::B, 0, 0, 0, 64};
  auto a = rv.post_send(0, 1, act(1), {1});
  auto b = rv.post_send(1, 0, grad, {2});
  auto c = rv.post_recv(1, 0, grad, {3});
  auto d = rv.post_recv(0, 1, act(1), {4});
  CHECK(a->wait(100ms) == std::pair{1, 4});
  CHECK(c->wait(100ms) == std::pair{2, 3});
}

TEST_CASE("an order mismatch is an error naming both ranks and tensors", "[loopback]") {
  R rv = make();
  auto s = rv.post_send(0, 1, act(0, 1), {1});
  auto r = rv.post_recv(0, 1, act(0, 0), {2});
  CHECK_THROWS_WITH(s->wait(100ms), Contains("order mismatch between rank 0 and rank 1") &&
                                        Contains("sends activation of mb 0 slice 1 (64 B)") &&
                                        Contains("expects activation of mb 0 (64 B)"));
  CHECK_THROWS_WITH(r->wait(100ms), Contains("order mismatch"));
}

TEST_CASE("an unmatched post times out naming the rank and op, and pending lists it", "[loopback]") {
  R rv = make();
  auto s = rv.post_send(2, 3, act(7), {1});
  auto lines = rv.pending();
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == "rank 2: SEND activation of mb 7 (64 B) to rank 3");
  CHECK_THROWS_WITH(s->wait(20ms), Contains("rank 2 waited 20 ms for SEND activation of mb 7") &&
                                       Contains("deadlocks"));
}

TEST_CASE("abort wakes every waiter and fails later posts", "[loopback]") {
  R rv = make();
  auto s = rv.post_send(0, 1, act(0), {1});
  std::thread t([&] {  // abort() does not throw; the thread needs no exception relay
    std::this_thread::sleep_for(10ms);
    rv.abort("rank 1 failed: boom");
  });
  CHECK_THROWS_WITH(s->wait(5000ms), Contains("aborted: rank 1 failed: boom"));
  t.join();
  auto late = rv.post_recv(0, 1, act(0), {2});
  CHECK_THROWS_WITH(late->wait(10ms), Contains("aborted"));
}

TEST_CASE("a 1F1B-like exchange between two threads completes in order", "[loopback]") {
  R rv = make();
  constexpr int kMb = 50;
  std::vector<std::pair<int, int>> got(kMb);
  // A failure inside the thread (wait() throws on timeout or mismatch) is carried
  // out and rethrown here, where Catch reports it, instead of terminating the run.
  std::exception_ptr receiver_error;
  std::thread receiver([&] {
    try {
      for (int mb = 0; mb < kMb; ++mb) got[mb] = rv.post_recv(0, 1, act(mb), {1000 + mb})->wait(2000ms);
    } catch (...) {
      receiver_error = std::current_exception();
    }
  });
  std::exception_ptr sender_error;
  try {
    for (int mb = 0; mb < kMb; ++mb) rv.post_send(0, 1, act(mb), {mb})->wait(2000ms);
  } catch (...) {
    sender_error = std::current_exception();
    rv.abort("sender failed");  // wakes the receiver at once instead of after its timeout
  }
  receiver.join();
  if (sender_error) std::rethrow_exception(sender_error);
  if (receiver_error) std::rethrow_exception(receiver_error);
  for (int mb = 0; mb < kMb; ++mb) CHECK(got[mb] == std::pair{mb, 1000 + mb});
}

TEST_CASE("a failing match function fails both sides", "[loopback]") {
  R rv([](const Side&, const Side&) -> std::pair<int, int> { throw tdpipe::Error("copy failed"); });
  auto s = rv.post_send(0, 1, act(0), {1});
  auto r = rv.post_recv(0, 1, act(0), {2});
  CHECK_THROWS_WITH(s->wait(100ms), "copy failed");
  CHECK_THROWS_WITH(r->wait(100ms), "copy failed");
}

TEST_CASE("try_wait returns nothing until matched, then the result", "[loopback]") {
  R rv = make();
  auto s = rv.post_send(0, 1, act(3), {7});
  CHECK_FALSE(s->try_wait(1ms).has_value());
  rv.post_recv(0, 1, act(3), {8});
  auto got = s->try_wait(100ms);
  REQUIRE(got.has_value());
  CHECK(*got == std::pair{7, 8});
}
