// One rank of the real-process collective tests (tests/collectives.test.cpp).
// Started by dopt-run, mpirun or by hand; joins the world with
// dopt::init_process_group and runs one scenario:
//
//   dopt_collectives_peer battery    every collective, dtype and reduce op,
//                                    small (inline) and large (shared memory)
//                                    tensors, subgroups, send/recv, many calls
//                                    in flight; each result checked against
//                                    values computed here independently
//   dopt_collectives_peer mismatch   rank 0 calls all_reduce, the others
//                                    broadcast: everyone must get
//                                    CollectiveMismatchError (8 elements)
//   dopt_collectives_peer mismatch_big  the same with 4 MiB
//   dopt_collectives_peer mismatch_half  the lower half of the ranks call
//                                    all_reduce, the upper half broadcast
//   dopt_collectives_peer kill       rank 1 joins a large all_reduce and then
//                                    kills itself (SIGKILL): the others must get
//                                    PeerLostError naming rank 1
//   dopt_collectives_peer stop       the same, but rank 1 stops (SIGSTOP): its
//                                    connections stay open and only the missing
//                                    heartbeats tell (the test kills it after)
//   dopt_collectives_peer loop       small all_reduces for 4 seconds (the test
//                                    suspends and continues the ranks meanwhile)
//   dopt_collectives_peer digest     every collective on pseudo-random floats
//                                    (sums that round differently in another
//                                    order), every float dtype, small and large
//                                    (several chunks); prints "digest R HEX", a
//                                    hash of every result of this rank: runs of
//                                    one world size on any planes must print
//                                    the same digests (tests/multihost.sh)
//   dopt_collectives_peer cut        8 MiB all_reduces for up to 60 s (the
//                                    multi-host test cuts a link meanwhile)
//   dopt_collectives_peer p2pkill    rank 1 sends 8 MiB to rank 0 (tag 5) and
//                                    kills itself; rank 0 waits in a recv of
//                                    tag 6 from rank 1, the others in a barrier:
//                                    all must get PeerLostError naming rank 1
//   dopt_collectives_peer launch     prints the launch contract as this rank
//                                    read it: "launch R source=S world_size=W
//                                    local_rank=L local_world_size=N job_id=J
//                                    job_id_from=VAR" (tests/launchers.sh
//                                    compares it with what srun set)
//
// stdout: "ok R <checks>" on success, otherwise "error KIND: MESSAGE" (and
// "elapsed_ms N" for the failure scenarios) and exit status 1.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/launch_env.hpp"
#include "dopt/runtime/tensor.hpp"
#include "peer_main.hpp"
#include "reductions.hpp"

namespace {

using dopt::DType;
using dopt::ReduceOp;
using dopt::Tensor;

/// Input element i of rank r: a small integer, exact in every dtype.
double input(int r, std::int64_t i) { return static_cast<double>(((r + 1) * 7 + i * 3) % 9) - 4.0; }

Tensor make_input(int r, std::int64_t n, DType dt, std::int64_t offset = 0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = input(r, i + offset);
  return Tensor::from_vector(v, {n}).to(dt);
}

double reduce_expected(ReduceOp op, int n, std::int64_t i, std::int64_t offset = 0) {
  const double acc = dopt::testing::reduce_in_rank_order(op, n, [&](int r) { return input(r, i + offset); });
  return op == ReduceOp::avg ? acc / n : acc;
}

struct Checker : dopt::testing::Checker {
  /// got == expected values (rounded to got's dtype), exactly, or within a
  /// relative tolerance for avg (one division, rounded differently).
  void values(const Tensor& got, const std::function<double(std::int64_t)>& want, const std::string& what,
              bool approx = false) {
    const Tensor g = got.to(DType::float64);
    const double* p = g.data<double>();
    std::vector<double> w(static_cast<std::size_t>(g.numel()));
    for (std::int64_t i = 0; i < g.numel(); ++i) w[static_cast<std::size_t>(i)] = want(i);
    const Tensor wr = Tensor::from_vector(w, {g.numel()}).to(got.dtype()).to(DType::float64);
    const double* q = wr.data<double>();
    const double tol = got.dtype() == DType::float16 || got.dtype() == DType::bfloat16 ? 1e-2 : 1e-6;
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      const bool ok = approx ? std::abs(p[i] - q[i]) <= tol * std::max(1.0, std::abs(q[i])) : p[i] == q[i];
      if (!ok)
        expect(false, what + ": element " + std::to_string(i) + " is " + std::to_string(p[i]) + ", expected " +
                          std::to_string(q[i]));
    }
    ++checks;
  }
};

bool is_float(DType d) {
  return d == DType::float32 || d == DType::float64 || d == DType::float16 || d == DType::bfloat16;
}

void battery(dopt::ProcessGroup& world, Checker& c) {
  const int me = world.rank(), n = world.size();
  const std::vector<DType> dtypes{DType::float32, DType::float64, DType::float16, DType::bfloat16, DType::int32,
                                  DType::int64};
  // 1000 elements travel inline in the control message; 40000 and 300001
  // (not divisible by the world size) go through shared memory.
  const std::vector<std::int64_t> sizes{1, 1000, 40000, 300001};
  for (DType dt : dtypes) {
    const std::string dn(dopt::dtype_name(dt));
    for (std::int64_t len : sizes) {
      const std::string tag = dn + "[" + std::to_string(len) + "]";
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::product, ReduceOp::min, ReduceOp::max}) {
        if (op == ReduceOp::avg && !is_float(dt)) continue;
        Tensor t = make_input(me, len, dt);
        world.all_reduce(t, op);
        c.values(t, [&](std::int64_t i) { return reduce_expected(op, n, i); },
                 "all_reduce(" + std::string(dopt::reduce_op_name(op)) + ") " + tag, op == ReduceOp::avg);
      }
      for (int root = 0; root < n; ++root) {
        Tensor t = me == root ? make_input(root, len, dt) : Tensor::zeros({len}, dt);
        world.broadcast(t, root);
        c.values(t, [&](std::int64_t i) { return input(root, i); }, "broadcast from " + std::to_string(root) + " " + tag);
      }
      {
        const int dst = static_cast<int>(len % n);
        Tensor t = make_input(me, len, dt);
        world.reduce(t, dst, ReduceOp::sum);
        if (me == dst)
          c.values(t, [&](std::int64_t i) { return reduce_expected(ReduceOp::sum, n, i); }, "reduce " + tag);
        else
          c.values(t, [&](std::int64_t i) { return input(me, i); }, "reduce leaves non-root input " + tag);
      }
      {
        std::vector<Tensor> outs;
        for (int r = 0; r < n; ++r) outs.push_back(Tensor::zeros({len}, dt));
        world.all_gather(outs, make_input(me, len, dt));
        for (int r = 0; r < n; ++r)
          c.values(outs[static_cast<std::size_t>(r)], [&](std::int64_t i) { return input(r, i); },
                   "all_gather part " + std::to_string(r) + " " + tag);
        Tensor flat = Tensor::zeros({len * n}, dt);
        world.all_gather_into_tensor(flat, make_input(me, len, dt));
        c.values(flat, [&](std::int64_t i) { return input(static_cast<int>(i / len), i % len); },
                 "all_gather_into_tensor " + tag);
      }
      {
        // inputs[k] of rank r = rank r's input at offset k * len.
        std::vector<Tensor> ins;
        for (int k = 0; k < n; ++k) ins.push_back(make_input(me, len, dt, k * len));
        Tensor out = Tensor::zeros({len}, dt);
        world.reduce_scatter(out, ins, ReduceOp::sum);
        c.values(out, [&](std::int64_t i) { return reduce_expected(ReduceOp::sum, n, i, me * len); },
                 "reduce_scatter " + tag);
      }
      if (n > 1) {  // a ring of send/recv
        const int to = (me + 1) % n, from = (me + n - 1) % n;
        Tensor got = Tensor::zeros({len}, dt);
        auto s = world.send_async(make_input(me, len, dt), to, 7);
        world.recv(got, from, 7);
        s.get();
        c.values(got, [&](std::int64_t i) { return input(from, i); }, "recv from " + std::to_string(from) + " " + tag);
      }
    }
  }
  // Many calls in flight at once, completed in any order.
  {
    std::vector<Tensor> ts;
    std::vector<dopt::Future<void>> fs;
    for (int k = 0; k < 12; ++k) {
      ts.push_back(make_input(me, 1000 + 9000 * k, DType::float32));
      fs.push_back(world.all_reduce_async(ts.back()));
    }
    for (int k = 11; k >= 0; --k) fs[static_cast<std::size_t>(k)].get();
    for (int k = 0; k < 12; ++k)
      c.values(ts[static_cast<std::size_t>(k)], [&](std::int64_t i) { return reduce_expected(ReduceOp::sum, n, i); },
               "in-flight all_reduce " + std::to_string(k));
  }
  // Coalesced calls over tensors of several shapes (one flat buffer): torch's
  // averaging (x / n, then summed in gloo's ring order), and a broadcast.
  for (std::int64_t len : {std::int64_t{5}, std::int64_t{90001}}) {
    const std::vector<std::int64_t> shapes{len, 3, len / 2 + 1};
    std::int64_t total = 0;
    for (auto k : shapes) total += k;
    std::vector<Tensor> parts;
    std::int64_t off = 0;
    for (auto k : shapes) {
      parts.push_back(make_input(me, k, DType::float32, off));
      off += k;
    }
    dopt::AllReduceCoalescedOptions o;
    o.order = dopt::ReduceOrder::ring;
    o.pre_divisor = n;
    world.all_reduce_coalesced(parts, o);
    // gloo's ring (measured against torch 1.13): segments of at most 1 MiB, at
    // least 2n of them and a multiple of n, of ceil(bytes / segments) bytes;
    // run b of (segments / n) segments is summed from rank b - 1 down to rank b.
    auto up = [](std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; };
    const std::int64_t bytes = 4 * total;
    const std::int64_t seg0 = up(std::min<std::int64_t>((bytes + 2 * n - 1) / (2 * n), 1 << 20), 4);
    const std::int64_t nseg = up(std::max<std::int64_t>((bytes + seg0 - 1) / seg0, 2 * n), n);
    const std::int64_t span = std::max<std::int64_t>(1, (nseg / n) * up((bytes + nseg - 1) / nseg, 4) / 4);
    auto want = [&](std::int64_t g) {
      const int b = static_cast<int>(std::min<std::int64_t>(g / span, n - 1));
      float acc = 0;
      for (int j = 0; j < n; ++j) {
        const int r = n < 3 ? j : ((b - 1 - j) % n + n) % n;
        const float x = static_cast<float>(input(r, g)) / static_cast<float>(n);
        acc = j == 0 ? x : acc + x;
      }
      return static_cast<double>(acc);
    };
    off = 0;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      c.values(parts[k], [&](std::int64_t i) { return want(off + i); },
               "all_reduce_coalesced(ring, x / n) part " + std::to_string(k) + " of " + std::to_string(total));
      off += shapes[k];
    }
    std::vector<Tensor> b{me == 0 ? make_input(0, len, DType::float64) : Tensor::zeros({len}, DType::float64),
                          me == 0 ? make_input(0, 3, DType::int32, 7) : Tensor::zeros({3}, DType::int32)};
    world.broadcast_coalesced(b, 0);
    c.values(b[0], [&](std::int64_t i) { return input(0, i); }, "broadcast_coalesced part 0");
    c.values(b[1], [&](std::int64_t i) { return input(0, i + 7); }, "broadcast_coalesced part 1");
  }
  world.barrier();
  // Subgroups: the even ranks, and pairs (when the world size is even).
  {
    std::vector<int> evens;
    for (int r = 0; r < n; r += 2) evens.push_back(r);
    dopt::ProcessGroup g = world.new_group(evens);
    c.expect(g.is_member() == (me % 2 == 0), "new_group membership");
    if (g.is_member()) {
      Tensor t = Tensor::full({50000}, me + 1.0);
      g.all_reduce(t);
      double want = 0;
      for (int r : evens) want += r + 1.0;
      c.values(t, [&](std::int64_t) { return want; }, "all_reduce in the group of even ranks");
    }
    if (n % 2 == 0) {
      auto sub = world.new_subgroups(2);
      Tensor t = Tensor::full({7}, me + 1.0);
      sub.current.all_reduce(t);
      const int base = me - me % 2;
      c.values(t, [&](std::int64_t) { return base + 1.0 + base + 2.0; }, "all_reduce in subgroup of 2");
    }
  }
  world.barrier();
}

/// FNV-1a over the bytes of every tensor this rank got back.
struct Digest {
  std::uint64_t h = 1469598103934665603ULL;
  void add(const Tensor& t) {
    const auto* p = static_cast<const unsigned char*>(t.data_ptr());
    for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ULL;
  }
};

/// Pseudo-random values in [-1, 1) with many mantissa bits (rank, stream).
Tensor random_input(int r, int stream, std::int64_t n, DType dt) {
  std::vector<double> v(static_cast<std::size_t>(n));
  std::uint64_t x = 0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(r + 1) + 7919ULL * static_cast<std::uint64_t>(stream);
  for (auto& e : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    e = static_cast<double>(x >> 11) / static_cast<double>(1ULL << 53) * 2.0 - 1.0;
  }
  return Tensor::from_vector(v, {n}).to(dt);
}

void digest(dopt::ProcessGroup& world, Checker& c) {
  const int n = world.size(), me = world.rank();
  Digest d;
  int stream = 0;
  // reduce_scatter of n parts of len / n + 1 elements, into the digest
  auto reduce_scatter = [&](std::int64_t len, DType dt) {
    std::vector<Tensor> ins;
    for (int k = 0; k < n; ++k) ins.push_back(random_input(me, ++stream, len / n + 1, dt));
    Tensor out = Tensor::zeros({len / n + 1}, dt);
    world.reduce_scatter(out, ins);
    d.add(out);
  };
  for (DType dt : {DType::float32, DType::float64, DType::float16, DType::bfloat16}) {
    for (std::int64_t len : {std::int64_t{1000}, std::int64_t{70001}, std::int64_t{1300007}}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        Tensor t = random_input(me, ++stream, len, dt);
        world.all_reduce(t, op);
        d.add(t);
      }
      std::vector<Tensor> parts{random_input(me, ++stream, len / 3, dt), random_input(me, ++stream, len - len / 3, dt)};
      dopt::AllReduceCoalescedOptions o;
      o.order = dopt::ReduceOrder::ring;
      world.all_reduce_coalesced(parts, o);
      for (auto& p : parts) d.add(p);
      // one tensor: ring order, and a pre-divisor (the hierarchical plane's
      // cross-memory all_reduce takes one range only)
      Tensor one = random_input(me, ++stream, len, dt);
      world.all_reduce_coalesced({one}, o);
      d.add(one);
      dopt::AllReduceCoalescedOptions pd;
      pd.pre_divisor = n;
      Tensor div = random_input(me, ++stream, len, dt);
      world.all_reduce_coalesced({div}, pd);
      d.add(div);
      Tensor r = random_input(me, ++stream, len, dt);
      world.reduce(r, n - 1);
      if (me == n - 1) d.add(r);
      Tensor b = random_input(me, ++stream, len, dt);
      world.broadcast(b, 1 % n);
      d.add(b);
      std::vector<Tensor> outs;
      for (int k = 0; k < n; ++k) outs.push_back(Tensor::zeros({len / n + 1}, dt));
      world.all_gather(outs, random_input(me, ++stream, len / n + 1, dt));
      for (auto& o2 : outs) d.add(o2);
      // into one tensor, and in place (the input is this rank's part of it)
      Tensor flat = Tensor::zeros({(len / n + 1) * n}, dt);
      world.all_gather_into_tensor(flat, random_input(me, ++stream, len / n + 1, dt));
      d.add(flat);
      Tensor inplace = Tensor::zeros({(len / n + 1) * n}, dt);
      Tensor part = inplace.flat_slice((len / n + 1) * me, len / n + 1);
      part.copy_(random_input(me, ++stream, len / n + 1, dt));
      world.all_gather_into_tensor(inplace, part);
      d.add(inplace);
      reduce_scatter(len, dt);
    }
  }
  // 16-bit floats over 4 MiB (float32 accumulators through the hierarchical
  // plane's cross-memory all_reduce; 3 chunks of its buffer, so both of its
  // accumulator slots are reused)
  for (DType dt : {DType::bfloat16, DType::float16}) {
    const std::int64_t len = 5000011;
    Tensor t = random_input(me, ++stream, len, dt);
    world.all_reduce(t, ReduceOp::avg);
    d.add(t);
    dopt::AllReduceCoalescedOptions o;
    o.order = dopt::ReduceOrder::ring;
    Tensor ring = random_input(me, ++stream, len, dt);
    world.all_reduce_coalesced({ring}, o);
    d.add(ring);
    reduce_scatter(len, dt);
  }
  std::printf("digest %d %016llx\n", me, static_cast<unsigned long long>(d.h));
  c.expect(true, "digest");
}

// Waits until process `pid` is dead (a zombie or gone) or stopped, reading /proc; at most
// 20 s, so that a pid from another pid namespace cannot hang the test.
void wait_gone(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < end) {
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) return;
    char buf[512] = {};
    const std::size_t got = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    const char* close = std::strrchr(buf, ')');  // the state follows "(comm) "
    if (got == 0 || close == nullptr || close[1] == 0) return;
    const char state = close[2];
    if (state == 'Z' || state == 'X' || state == 'T' || state == 't') return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "battery";
  // The failure scenarios end in an error on purpose: no final barrier.
  return dopt::testing::run_peer(
      [&](dopt::ProcessGroup& world, int rank) {
        Checker c{{rank}};
        if (mode == "battery") {
          battery(world, c);
          const auto st = world.plane_stats();
          std::printf("plane %s %llu\n", st.plane.c_str(), static_cast<unsigned long long>(st.bytes_to_other_hosts));
        } else if (mode == "digest") {
          digest(world, c);
          const auto st = world.plane_stats();
          std::printf("plane %s %llu\n", st.plane.c_str(), static_cast<unsigned long long>(st.bytes_to_other_hosts));
          std::printf("read from host peers %llu\n", static_cast<unsigned long long>(st.bytes_read_from_host_peers));
        } else if (mode == "cut") {
          Tensor t = Tensor::full({2 << 20}, 1.0);
          world.barrier();
          std::printf("cut: running\n");
          std::fflush(stdout);
          const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
          while (std::chrono::steady_clock::now() < end) world.all_reduce(t);
          c.expect(false, "the link was cut, yet every all_reduce of 60 s completed");
        } else if (mode == "mismatch" || mode == "mismatch_big" || mode == "mismatch_half") {
          Tensor t = Tensor::full({mode == "mismatch_big" ? 1 << 20 : 8}, 1.0);
          if (mode == "mismatch_half" ? rank < world.size() / 2 : rank == 0) world.all_reduce(t);
          else world.broadcast(t, 0);
        } else if (mode == "kill" || mode == "stop") {
          Tensor t = Tensor::full({1 << 20}, 1.0);
          Tensor pids = Tensor::zeros({world.size()}, DType::int64);
          world.all_gather_into_tensor(pids, Tensor::full({1}, static_cast<double>(::getpid()), DType::int64));
          world.barrier();
          if (rank == 1) {
            auto f = world.all_reduce_async(t);
            ::kill(::getpid(), mode == "kill" ? SIGKILL : SIGSTOP);
          }
          // Rank 0 joins only once rank 1 is dead or stopped, so rank 1's call can never
          // complete (before, a rank 1 preempted between posting and the signal could see
          // its all_reduce through); the others are in the middle of theirs.
          if (rank == 0) wait_gone(static_cast<pid_t>(pids.data<std::int64_t>()[1]));
          world.all_reduce(t);
        } else if (mode == "loop") {
          const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(4);
          Tensor t = Tensor::full({16}, 1.0);
          bool go = true;
          while (go) {
            world.all_reduce(t);
            Tensor flag = Tensor::full({1}, std::chrono::steady_clock::now() < end ? 1.0 : 0.0);
            world.all_reduce(flag, ReduceOp::min);  // every rank stops after the same call
            go = flag.data<float>()[0] > 0;
            // Rank 0 lags, so the others' waits check liveness on every call.
            std::this_thread::sleep_for(std::chrono::milliseconds(world.rank() == 0 ? 20 : 1));
          }
          c.expect(true, "loop");
        } else if (mode == "p2pkill") {
          world.barrier();
          if (rank == 1) {
            auto f = world.send_async(Tensor::full({2 << 20}, 1.0), 0, 5);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));  // published
            ::kill(::getpid(), SIGKILL);
          }
          if (rank == 0) world.recv(Tensor::zeros({4}), 1, 6);
          else world.barrier();
        } else if (mode == "launch") {
          const auto env = dopt::launch_env_from_environment();
          c.expect(env && env->rank == rank && env->world_size == world.size(),
                   "the launch contract read again differs");
          std::printf("launch %d source=%s world_size=%d local_rank=%d local_world_size=%d job_id=%s job_id_from=%s\n",
                      rank, env->source.c_str(), env->world_size, env->local_rank, env->local_world_size,
                      env->job_id.c_str(), env->job_id_source.c_str());
          world.barrier();
        } else {
          throw dopt::testing::Usage{
              "dopt_collectives_peer battery | digest | cut | mismatch | mismatch_big | mismatch_half | kill | stop | loop | p2pkill | launch"};
        }
        return c.checks;
      },
      mode == "battery" || mode == "digest");
}
