// engine_actors.cpp — the SimGrid engine's actors (one per simulated GPU and stream) and their synchronisation (the Model: engine_model.hpp).
#include "engine_model.hpp"

namespace tdpipe::sim::detail::engine {

// ---------------------------------------------------------------------------------
// Synchronisation between actors: per-GPU done flags under one condition variable.

void Model::notify(int gi) {
  GpuRun& g = gpus_[gi];
  std::unique_lock<sg4::Mutex> lock(*g.mutex);
  g.cv->notify_all();
}

void Model::wait_op(int gi, int op) {
  GpuRun& g = gpus_[gi];
  if (g.ops[op].done) return;
  std::unique_lock<sg4::Mutex> lock(*g.mutex);
  while (!g.ops[op].done) g.cv->wait(lock);
}

void Model::wait_posted(int gi, int op) {
  GpuRun& g = gpus_[gi];
  if (g.ops[op].posted) return;
  std::unique_lock<sg4::Mutex> lock(*g.mutex);
  while (!g.ops[op].posted) g.cv->wait(lock);
}

void Model::wait_recv_steps(int gi, int op, int steps) {
  GpuRun& g = gpus_[gi];
  if (g.ops[op].recv_steps >= steps) return;
  std::unique_lock<sg4::Mutex> lock(*g.mutex);
  while (g.ops[op].recv_steps < steps) g.cv->wait(lock);
}

void Model::wait_flowed(int gi, int op) {
  GpuRun& g = gpus_[gi];
  if (g.ops[op].flowed) return;
  std::unique_lock<sg4::Mutex> lock(*g.mutex);
  while (!g.ops[op].flowed) g.cv->wait(lock);
}

// Plain fidelity: the TP collectives inside every layer let no TP rank run an op before
// all of its group reached it (a degraded NIC holds one TP rank's activations back).
void Model::tp_barrier(int gi, int op) {
  GpuRun& g = gpus_[gi];
  if (reduced_ || place_.tensor <= 1 || opt_.faults.empty()) return;  // lanes alike without faults
  g.ops[op].arrived = true;
  notify(gi);
  for (int tp = 0; tp < place_.tensor; ++tp) {
    if (tp == g.tp) continue;
    GpuRun& peer = gpus_[sim_index(g.replica, g.stage, tp)];
    if (peer.ops[op].arrived) continue;
    std::unique_lock<sg4::Mutex> lock(*peer.mutex);
    while (!peer.ops[op].arrived) peer.cv->wait(lock);
  }
}

// A ring's members move in lockstep: the collective starts when its last member posts
// and every member finishes with the slowest one.
void Model::couple_start(int gi, int op) {
  GpuRun& g = gpus_[gi];
  if (g.coupled.empty()) return;
  g.ops[op].ready = true;  // (after a compressed all-reduce's kernels)
  notify(gi);
  for (int c : g.coupled) {
    GpuRun& peer = gpus_[c];
    if (peer.ops[op].ready) continue;
    std::unique_lock<sg4::Mutex> lock(*peer.mutex);
    while (!peer.ops[op].ready) peer.cv->wait(lock);
  }
}

void Model::couple_end(int gi, int op) {
  if (gpus_[gi].coupled.empty()) return;
  gpus_[gi].ops[op].flowed = true;
  notify(gi);
  for (int c : gpus_[gi].coupled) wait_flowed(c, op);
}

void Model::wait_deps(int gi, int op, int stream) {
  GpuRun& g = gpus_[gi];
  g.waiting[stream] = op;
  const RankInfo& info = ranks_[g.stage];
  const ir::Op& o = plan_.ranks[g.stage][op];
  const bool copy = o.stream == ir::Stream::Copy;
  const bool partial = (opt_.overlap_dp || copy) && o.ready_after < 1.0f && !o.deps.empty() &&
                       o.deps.front().rank == g.stage;
  const int first_gates = partial ? static_cast<int>(info.gates[o.deps.front().index].size()) : 0;
  if (partial && first_gates > 0) {
    // A block's release: the end of the gated op's segment ready_after names.
    const int first = o.deps.front().index;
    const int k = ir::gate_segment(o.ready_after, first_gates);
    if (g.ops[first].segments <= k && !g.ops[first].done) {
      std::unique_lock<sg4::Mutex> lock(*g.mutex);
      while (g.ops[first].segments <= k && !g.ops[first].done) g.cv->wait(lock);
    }
  } else if (partial) {
    // A gradient bucket, final part-way through the chunk's last backward op: that far
    // into its planned duration (the compute host runs one op at a time).
    const int first = o.deps.front().index;
    if (!g.ops[first].done) {
      std::unique_lock<sg4::Mutex> lock(*g.mutex);
      ++g.partial_waiters;
      while (g.ops[first].start < 0 && !g.ops[first].done) g.cv->wait(lock);
      --g.partial_waiters;
    }
    const double at = g.ops[first].start + static_cast<double>(o.ready_after) * info.seconds[first] * g.slow;
    if (!g.ops[first].done && at > sg4::Engine::get_clock()) sg4::this_actor::sleep_until(at);
  }
  for (int d : info.local_deps[op]) {
    if (partial && d == o.deps.front().index) continue;  // waited for above
    wait_op(gi, d);
  }
  for (const ir::OpRef& d : info.remote_deps[op]) wait_op(peer_index(g, d.rank), d.index);
}

void Model::mark_done(int gi, int op, double now) {
  GpuRun& g = gpus_[gi];
  g.ops[op].end = now;
  g.ops[op].done = true;
  ++done_ops_;
  if (progress_ && done_ops_ * 100 >= next_progress_ * total_ops_) {
    progress_(static_cast<double>(done_ops_) / static_cast<double>(total_ops_));
    next_progress_ = done_ops_ * 100 / std::max<std::int64_t>(total_ops_, 1) + 1;
  }
  notify(gi);
}

// ---------------------------------------------------------------------------------
// Actors.

void Model::compute_actor(int gi) {
  GpuRun& g = gpus_[gi];
  const RankInfo& info = ranks_[g.stage];
  const double speed = g.compute_host->get_speed() * g.slow;
  for (int op : info.stream_ops[0]) {
    wait_deps(gi, op, 0);
    tp_barrier(gi, op);
    const std::vector<int>& gates = info.gates[op];
    if (gates.empty()) {
      g.ops[op].start = sg4::Engine::get_clock();
      if (g.partial_waiters > 0) notify(gi);  // a bucket may wait for part of this op
      if (info.seconds[op] > 0) sg4::this_actor::execute(info.seconds[op] * speed);
    } else {
      // Parameter offload: segment k runs once its layer block's LOAD is done.
      const int n = static_cast<int>(gates.size());
      for (int k = 0; k < n; ++k) {
        wait_op(gi, gates[static_cast<std::size_t>(k)]);
        if (k == 0) {
          g.ops[op].start = sg4::Engine::get_clock();
          if (g.partial_waiters > 0) notify(gi);
        }
        const double part = info.seconds[op] / n;
        if (part > 0) sg4::this_actor::execute(part * speed);
        ++g.ops[op].segments;
        notify(gi);  // the block used in segment k is released
      }
    }
    mark_done(gi, op, sg4::Engine::get_clock());
  }
  g.waiting[0] = -1;
}

void Model::copy_actor(int gi) {
  // Host ↔ device copies, one at a time on the rank's copy engine, at est_seconds (the
  // cost model's PCIe time: a dedicated link per GPU; shared host uplinks not modelled).
  GpuRun& g = gpus_[gi];
  const RankInfo& info = ranks_[g.stage];
  for (int op : info.stream_ops[3]) {
    wait_deps(gi, op, 3);
    g.ops[op].start = sg4::Engine::get_clock();
    if (info.seconds[op] > 0) sg4::this_actor::sleep_for(info.seconds[op]);
    mark_done(gi, op, sg4::Engine::get_clock());
  }
  g.waiting[3] = -1;
}

void Model::post(int gi, int op, std::vector<PendingComm>& mine) {
  GpuRun& g = gpus_[gi];
  const ir::Op& o = plan_.ranks[g.stage][op];
  g.ops[op].posted = true;
  const int pi = peer_index(g, o.peer);
  const int pj = ranks_[g.stage].match[op];
  // No simcall between the check and the start: actors interleave only at simcalls,
  // so exactly one of the two sides starts the transfer.
  if (!gpus_[pi].ops[pj].posted) return;  // the peer's post starts the transfer
  const bool send = o.kind == OpKind::SEND;
  const int sg = send ? gi : pi, so = send ? op : pj, rg = send ? pi : gi, ro = send ? pj : op;
  const ir::Op& s_op = plan_.ranks[gpus_[sg].stage][so];
  double bytes = synthetic_ ? 0.0 : static_cast<double>(s_op.bytes);
  if (opt_.p2p_split_across_tp) bytes /= place_.tensor;
  const GpuRun& a = gpus_[sg];
  const GpuRun& b = gpus_[rg];
  const bool local = synthetic_ || same_node(a.gpu, b.gpu);
  sg4::Host* from = local ? a.compute_host : a.nic_host;
  sg4::Host* to = local ? b.compute_host : b.nic_host;
  ++flows_;
  // SimGrid 3.32's wait_any never completes a 0-byte sendto; one byte costs < 0.1 ns.
  mine.push_back({sg4::Comm::sendto_async(from, to, std::max(bytes, 1.0)), sg, so, rg, ro});
  gpus_[sg].ops[so].xfer = gpus_[rg].ops[ro].xfer = sg4::Engine::get_clock();
}

void Model::p2p_actor(int gi) {
  GpuRun& g = gpus_[gi];
  const std::vector<int>& ops = ranks_[g.stage].stream_ops[1];
  const auto& plan_ops = plan_.ranks[g.stage];
  std::vector<PendingComm> mine;
  for (std::size_t i = 0; i < ops.size();) {
    std::size_t j = i + 1;
    const int batch = plan_ops[ops[i]].batch;
    while (batch >= 0 && j < ops.size() && plan_ops[ops[j]].batch == batch) ++j;
    for (std::size_t k = i; k < j; ++k) wait_deps(gi, ops[k], 1);
    const double now = sg4::Engine::get_clock();
    for (std::size_t k = i; k < j; ++k) {
      const ir::Op& o = plan_ops[ops[k]];
      g.ops[ops[k]].start = now;
      if (ir::is_p2p(o.kind)) {
        post(gi, ops[k], mine);
      } else {
        if (ranks_[g.stage].seconds[ops[k]] > 0) sg4::this_actor::sleep_for(ranks_[g.stage].seconds[ops[k]]);
        mark_done(gi, ops[k], sg4::Engine::get_clock());
      }
    }
    while (!mine.empty()) {
      std::vector<sg4::CommPtr> comms;
      for (auto& pc : mine) comms.push_back(pc.comm);
      const auto idx = static_cast<std::size_t>(sg4::Comm::wait_any(comms));
      const PendingComm pc = mine[idx];
      mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(idx));
      const double t = sg4::Engine::get_clock();
      mark_done(pc.send_gpu, pc.send_op, t);
      mark_done(pc.recv_gpu, pc.recv_op, t);
    }
    for (std::size_t k = i; k < j; ++k) wait_op(gi, ops[k]);
    i = j;
  }
  g.waiting[1] = -1;
}


void Model::dp_actor(int gi) {
  GpuRun& g = gpus_[gi];
  const RankInfo& info = ranks_[g.stage];
  for (int op : info.stream_ops[2]) {
    wait_deps(gi, op, 2);
    const ir::Op& o = plan_.ranks[g.stage][op];
    g.ops[op].start = g.ops[op].xfer = sg4::Engine::get_clock();
    g.ops[op].posted = true;
    notify(gi);
    if (ir::is_collective(o.kind)) run_collective(gi, op);
    else if (info.seconds[op] > 0) sg4::this_actor::sleep_for(info.seconds[op]);
    mark_done(gi, op, sg4::Engine::get_clock());
  }
  g.waiting[2] = -1;
}

void Model::spawn_actors() {
  for (std::size_t i = 0; i < gpus_.size(); ++i) {
    GpuRun& g = gpus_[i];
    g.mutex = sg4::Mutex::create();
    g.cv = sg4::ConditionVariable::create();
    const int gi = static_cast<int>(i);
    const RankInfo& info = ranks_[g.stage];
    const std::string base = fmt::format("g{}", g.gpu);
    if (!info.stream_ops[0].empty()) {
      sg4::Actor::create(base + "-compute", g.compute_host, [this, gi] { compute_actor(gi); });
      ++actors_;
    }
    if (!info.stream_ops[1].empty()) {
      sg4::Actor::create(base + "-p2p", g.compute_host, [this, gi] { p2p_actor(gi); });
      ++actors_;
    }
    if (!info.stream_ops[2].empty()) {
      sg4::Actor::create(base + "-dp", g.compute_host, [this, gi] { dp_actor(gi); });
      ++actors_;
    }
    if (!info.stream_ops[3].empty()) {
      sg4::Actor::create(base + "-copy", g.compute_host, [this, gi] { copy_actor(gi); });
      ++actors_;
    }
  }
}

}  // namespace tdpipe::sim::detail::engine
