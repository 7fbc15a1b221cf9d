// simt.cpp — the fiber scheduler behind simt.hpp: one Boost.Context fiber per thread
// of the running block (switches without system calls), resumed round by round until
// every thread has finished; barriers release when every thread they wait for has
// arrived.
#include "simt.hpp"

#include <memory>
#include <sstream>
#include <vector>

#include <boost/context/fiber.hpp>

namespace ctx = boost::context;

namespace simt {
namespace {

constexpr int kWarp = 32;
constexpr std::size_t kStack = 256 * 1024;

enum class State { Ready, AtSync, AtShuffle, Done, Faulted };

// A fiber's stack: the thread slot's own block, reused by every block and launch.
struct SlotStack {
  char* base;
  std::size_t size;
  ctx::stack_context allocate() {
    ctx::stack_context sc;
    sc.size = size;
    sc.sp = base + size;
    return sc;
  }
  void deallocate(ctx::stack_context&) noexcept {}
};

struct Fiber {
  std::unique_ptr<char[]> stack;  // first: outlives the fibers below, which unwind on it
  ctx::fiber self;                // where the scheduler resumes it
  ctx::fiber sink;                // where it returns to the scheduler
  uint3 tid{};
  State state = State::Ready;
  unsigned mask = 0;            // the shuffle it waits in
  std::uint64_t shuffles = 0;   // shuffle rendezvous passed (two per exchange)
};

struct Warp {
  std::uint64_t slot[kWarp] = {};
};

struct Machine {
  Order order = Order::Forward;
  std::int64_t launches = 0;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Fiber* current = nullptr;
  uint3 block{};
  dim3 block_dim, grid_dim;
  const std::function<void()>* body = nullptr;
  std::string fault;
};

// One per OS thread: the emulated streams (emu_runtime.cpp) each run their kernels.
Machine& m() {
  static thread_local Machine machine;
  return machine;
}

std::string where(const Fiber& f) {
  const Machine& mc = m();
  std::ostringstream s;
  s << "block (" << mc.block.x << "," << mc.block.y << "," << mc.block.z << ") thread (" << f.tid.x << ","
    << f.tid.y << "," << f.tid.z << ")";
  return s.str();
}

// Fiber → scheduler.
void yield() {
  Fiber* self = m().current;
  self->sink = std::move(self->sink).resume();
}

[[noreturn]] void fault(const std::string& what) {
  Machine& mc = m();
  mc.fault = what;
  mc.current->state = State::Faulted;
  yield();
  std::abort();  // a faulted fiber is never resumed
}

// Scheduler → fiber, until it waits or ends.
void resume(Fiber& f) {
  Machine& mc = m();
  mc.current = &f;
  f.self = std::move(f.self).resume();
  mc.current = nullptr;
}

int lane_of(const Fiber& f, const dim3& bd) {
  const unsigned linear = f.tid.x + bd.x * (f.tid.y + bd.y * f.tid.z);
  return static_cast<int>(linear % kWarp);
}

// Releases the block barrier and the warps' shuffles that can pass; false when none can.
bool release(std::vector<Fiber>& fibers, int nwarps) {
  bool released = false;
  bool any_sync = false, all_sync = true;
  for (const Fiber& f : fibers) {
    if (f.state == State::AtSync) any_sync = true;
    else if (f.state != State::Done) all_sync = false;
  }
  // Threads that exited count as arrived (as on the GPU since Volta).
  if (any_sync && all_sync) {
    for (Fiber& f : fibers)
      if (f.state == State::AtSync) f.state = State::Ready;
    released = true;
  }
  for (int w = 0; w < nwarps; ++w) {
    Fiber* first = nullptr;
    for (int l = 0; l < kWarp; ++l) {
      const std::size_t i = static_cast<std::size_t>(w * kWarp + l);
      if (i < fibers.size() && fibers[i].state == State::AtShuffle) {
        first = &fibers[i];
        break;
      }
    }
    if (first == nullptr) continue;
    const unsigned mask = first->mask;
    bool all_here = true;
    for (int l = 0; l < kWarp; ++l) {
      if (!(mask >> l & 1u)) continue;
      const std::size_t i = static_cast<std::size_t>(w * kWarp + l);
      if (i >= fibers.size())
        throw Error("__shfl_xor_sync mask 0x" + [&] { std::ostringstream s; s << std::hex << mask; return s.str(); }() +
                    " names lane " + std::to_string(l) + " of warp " + std::to_string(w) +
                    ", which the block does not have");
      const Fiber& f = fibers[i];
      if (f.state == State::Done)
        throw Error("__shfl_xor_sync in " + where(*first) + ": lane " + std::to_string(l) +
                    " of its mask has exited (the GPU would hang or return garbage)");
      if (f.state == State::AtShuffle && (f.mask != mask || f.shuffles != first->shuffles))
        throw Error("__shfl_xor_sync in warp " + std::to_string(w) +
                    ": lanes wait in different shuffles or with different masks");
      if (f.state != State::AtShuffle) all_here = false;
    }
    if (!all_here) continue;
    for (int l = 0; l < kWarp; ++l)
      if (mask >> l & 1u) fibers[static_cast<std::size_t>(w * kWarp + l)].state = State::Ready;
    released = true;
  }
  return released;
}

std::string describe_deadlock(const std::vector<Fiber>& fibers) {
  int sync = 0, shuffle = 0, done = 0;
  for (const Fiber& f : fibers) {
    sync += f.state == State::AtSync;
    shuffle += f.state == State::AtShuffle;
    done += f.state == State::Done;
  }
  std::ostringstream s;
  s << "deadlock: " << sync << " threads wait in __syncthreads, " << shuffle << " in __shfl_xor_sync, " << done
    << " exited";
  for (const Fiber& f : fibers)
    if (f.state == State::AtShuffle || f.state == State::AtSync) {
      s << " (first waiting: " << where(f) << (f.state == State::AtSync ? " in __syncthreads)" : " in a shuffle)");
      break;
    }
  return s.str();
}

}  // namespace

void set_order(Order order) { m().order = order; }
Order order() { return m().order; }
std::int64_t launches() { return m().launches; }

const uint3& thread_idx() { return m().current->tid; }
const uint3& block_idx() { return m().block; }
const dim3& block_dim() { return m().block_dim; }
const dim3& grid_dim() { return m().grid_dim; }

void syncthreads() {
  Machine& mc = m();
  if (mc.current == nullptr) throw Error("__syncthreads outside a kernel");
  mc.current->state = State::AtSync;
  yield();
}

std::uint64_t warp_exchange(unsigned mask, std::uint64_t value, int src_lane) {
  Machine& mc = m();
  Fiber& self = *mc.current;
  const int lane = lane_of(self, mc.block_dim);
  const std::size_t linear = static_cast<std::size_t>(&self - mc.fibers.data());
  Warp& warp = mc.warps[linear / kWarp];
  if (!(mask >> lane & 1u)) fault("__shfl_xor_sync by lane " + std::to_string(lane) + " not in its own mask");
  if (src_lane < 0 || src_lane >= kWarp || !(mask >> src_lane & 1u))
    fault("__shfl_xor_sync in " + where(self) + " reads lane " + std::to_string(src_lane) + ", outside the mask");
  warp.slot[lane] = value;
  self.mask = mask;
  self.state = State::AtShuffle;
  yield();  // every lane has published
  ++self.shuffles;
  const std::uint64_t got = warp.slot[src_lane];
  self.state = State::AtShuffle;
  yield();  // every lane has read: the slots may be reused
  ++self.shuffles;
  return got;
}

int check_config(dim3 grid, dim3 block) {
  const std::uint64_t threads = std::uint64_t(block.x) * block.y * block.z;
  // The GPU's limits (compute capability 8.0 and 9.0).
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.x == 0 ||
      grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    return cudaErrorInvalidConfiguration;
  return cudaSuccess;
}

void run(dim3 grid, dim3 block, const std::function<void()>& body) {
  Machine& mc = m();
  if (mc.current != nullptr) throw Error("a kernel launched from inside a kernel");
  if (check_config(grid, block) != cudaSuccess) throw Error("simt::run: a launch configuration the GPU refuses");
  const std::uint64_t threads = std::uint64_t(block.x) * block.y * block.z;
  ++mc.launches;
  mc.grid_dim = grid;
  mc.block_dim = block;
  mc.body = &body;
  const int nwarps = static_cast<int>((threads + kWarp - 1) / kWarp);
  mc.fibers.resize(threads);
  mc.warps.assign(static_cast<std::size_t>(nwarps), Warp{});
  // Blocks one after another, in reverse too: a GPU promises no order between blocks.
  const std::uint64_t blocks = std::uint64_t(grid.x) * grid.y * grid.z;
  for (std::uint64_t n = 0; n < blocks; ++n) {
    const std::uint64_t b = mc.order == Order::Forward ? n : blocks - 1 - n;
    mc.block = uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                     static_cast<unsigned>(b / (std::uint64_t(grid.x) * grid.y))};
    for (std::size_t i = 0; i < threads; ++i) {
      Fiber& f = mc.fibers[i];
      if (!f.stack) f.stack = std::make_unique_for_overwrite<char[]>(kStack);
      const unsigned u = static_cast<unsigned>(i);
      f.tid = uint3{u % block.x, u / block.x % block.y, u / (block.x * block.y)};
      f.state = State::Ready;
      f.shuffles = 0;
      // A fiber a fault left suspended is unwound first: the new one reuses its stack.
      f.self = ctx::fiber();
      f.self = ctx::fiber(std::allocator_arg, SlotStack{f.stack.get(), kStack}, [&f](ctx::fiber&& sink) {
        f.sink = std::move(sink);
        (*m().body)();
        f.state = State::Done;
        return std::move(f.sink);
      });
    }
    for (;;) {
      const bool forward = mc.order == Order::Forward;
      for (std::size_t k = 0; k < threads; ++k) {
        Fiber& f = mc.fibers[forward ? k : threads - 1 - k];
        if (f.state != State::Ready) continue;
        resume(f);
        if (f.state == State::Faulted) throw Error(mc.fault);  // its frames are abandoned
      }
      bool finished = true;
      for (const Fiber& f : mc.fibers) finished = finished && f.state == State::Done;
      if (finished) break;
      if (!release(mc.fibers, nwarps)) throw Error(describe_deadlock(mc.fibers));
    }
  }
  mc.body = nullptr;
}

}  // namespace simt
