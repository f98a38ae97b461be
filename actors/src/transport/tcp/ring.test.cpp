// Ring collectives over TcpMesh: N ranks as meshes in one process on 127.0.0.1.
// Results are compared bitwise with a sequential computation in group-rank order.
#include "dopt/actors/internal/ring.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <atomic>
#include <type_traits>
#include <vector>

#include "dopt/runtime/error.hpp"
#include "completions.hpp"
#include "loopback_mesh.hpp"

using dopt::DType;
using dopt::ReduceOp;
using dopt::detail::RingGroup;
using dopt::detail::RingOptions;
using dopt::transport::TcpMesh;
using namespace std::chrono_literals;
using Bytes = std::vector<unsigned char>;

namespace {

using dopt::testing::is;
using dopt::testing::loopback_meshes;
using dopt::testing::Meshes;
using dopt::testing::message_of;
using dopt::testing::Waiter;

RingGroup group_of(const Meshes& ms, std::vector<int> ranks, int me) {
  return RingGroup{ms[ranks[me]].get(), std::move(ranks), me};
}
RingGroup world(const Meshes& ms, int r) {
  std::vector<int> ranks(ms.size());
  for (std::size_t i = 0; i < ranks.size(); ++i) ranks[i] = int(i);
  return group_of(ms, ranks, r);
}

std::uint64_t next_op_id() {
  static std::atomic<std::uint64_t> id{1};
  return id++;
}

// How long a Waiter waits for the callbacks it handed out (bounded: a bug
// fails instead of hanging).
constexpr auto kBound = 120s;

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's data: values whose sums depend on the order (floats) and that wrap (ints).
Bytes make_data(DType dt, std::int64_t numel, int r, unsigned salt = 0) {
  Bytes out(std::size_t(numel) * dopt::itemsize(dt));
  dopt::dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    auto* p = reinterpret_cast<T*>(out.data());
    for (std::int64_t i = 0; i < numel; ++i) {
      const std::uint64_t h = mix(std::uint64_t(i) * 1315423911u + std::uint64_t(r) * 2654435761u + salt);
      if constexpr (std::is_same_v<T, dopt::Half> || std::is_same_v<T, dopt::BFloat16>) {
        p[i] = T(float(std::int64_t(h % 20001) - 10000) / 37.0f);
      } else if constexpr (std::is_floating_point_v<T>) {
        p[i] = T(double(std::int64_t(h % 2000001) - 1000000) / 3.7e3);
      } else if constexpr (std::is_same_v<T, bool>) {
        p[i] = (h & 1) != 0;
      } else {
        p[i] = static_cast<T>(h);
      }
    }
  });
  return out;
}

// The sequential reduction in rank order (written independently of reduce_range).
template <class T>
struct Acc {
  using type = std::conditional_t<std::is_same_v<T, dopt::Half> || std::is_same_v<T, dopt::BFloat16>,
                                  float, T>;
};

Bytes reference(DType dt, ReduceOp op, const std::vector<const unsigned char*>& xs, std::int64_t numel) {
  Bytes out(std::size_t(numel) * dopt::itemsize(dt));
  dopt::dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      using A = typename Acc<T>::type;
      auto load = [](const T& v) -> A {
        if constexpr (std::is_same_v<A, float> && !std::is_same_v<T, float>) return float(v);
        else return v;
      };
      auto* o = reinterpret_cast<T*>(out.data());
      for (std::int64_t i = 0; i < numel; ++i) {
        A acc = load(reinterpret_cast<const T*>(xs[0])[i]);
        for (std::size_t k = 1; k < xs.size(); ++k) {
          const A b = load(reinterpret_cast<const T*>(xs[k])[i]);
          if constexpr (std::is_integral_v<A>) {
            using U = std::make_unsigned_t<A>;
            if (op == ReduceOp::sum) acc = A(U(acc) + U(b));
            else if (op == ReduceOp::product) acc = A(U(acc) * U(b));
            else if (op == ReduceOp::min) acc = b < acc ? b : acc;
            else if (op == ReduceOp::max) acc = acc < b ? b : acc;
          } else {
            if (op == ReduceOp::sum || op == ReduceOp::avg) acc = acc + b;
            else if (op == ReduceOp::product) acc = acc * b;
            else if (op == ReduceOp::min) acc = b < acc ? b : acc;
            else if (op == ReduceOp::max) acc = acc < b ? b : acc;
          }
        }
        if constexpr (!std::is_integral_v<A>)
          if (op == ReduceOp::avg) acc = acc / A(xs.size());
        if constexpr (std::is_same_v<A, float> && !std::is_same_v<T, float>) o[i] = T(acc);
        else o[i] = acc;
      }
    }
  });
  return out;
}

const std::vector<DType> k_dtypes = {DType::float32, DType::float64, DType::float16,
                                     DType::bfloat16, DType::int32, DType::int64};

/// The ops the tests reduce dt with: avg on floating point only.
std::vector<ReduceOp> ops_for(DType dt) {
  std::vector<ReduceOp> ops;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::product, ReduceOp::min, ReduceOp::max})
    if (op != ReduceOp::avg || dopt::is_floating_point(dt)) ops.push_back(op);
  return ops;
}

// Option sets: the pipelined path with tiny odd chunks, and the defaults.
std::vector<RingOptions> option_sets() {
  RingOptions tiny;
  tiny.chunk_bytes = 1000;  // not a multiple of 8: chunks of 125 / 250 / 500 elements
  tiny.small_bytes = 0;
  tiny.pair_bytes = 0;
  tiny.window = 2;
  tiny.scratch_bytes = 0;
  return {tiny, RingOptions{}};
}

}  // namespace

TEST_CASE("ring all_reduce: every dtype, op, size and world size, bitwise in rank order", "[tcp][ring]") {
  const std::vector<std::int64_t> sizes = {0, 1, 3, 1001, 40009};
  for (int n : {1, 2, 3, 5}) {
    auto ms = loopback_meshes(n);
    for (const RingOptions& opt : option_sets())
      for (DType dt : k_dtypes)
        for (ReduceOp op : ops_for(dt)) {
          for (std::int64_t numel : sizes) {
            INFO("n=" << n << " dtype=" << dopt::dtype_name(dt) << " op=" << dopt::reduce_op_name(op)
                      << " numel=" << numel << " chunk=" << opt.chunk_bytes);
            std::vector<Bytes> in(n), buf(n);
            std::vector<const unsigned char*> ptrs;
            for (int r = 0; r < n; ++r) {
              in[r] = buf[r] = make_data(dt, numel, r);
              ptrs.push_back(in[r].data());
            }
            const Bytes want = reference(dt, op, ptrs, numel);
            const std::uint64_t id = next_op_id();
            Waiter w;
            for (int r = 0; r < n; ++r)
              dopt::detail::ring_all_reduce(world(ms, r), id, buf[r].data(), numel, dt, op, w.cb(r), opt);
            w.wait_ok(kBound);
            for (int r = 0; r < n; ++r) CHECK(buf[r] == want);
          }
        }
  }
}

TEST_CASE("ring all_reduce: 8M floats", "[tcp][ring]") {
  for (int n : {2, 3}) {
    auto ms = loopback_meshes(n);
    const std::int64_t numel = std::int64_t(8) << 20;
    std::vector<Bytes> buf(n);
    std::vector<const unsigned char*> ptrs;
    for (int r = 0; r < n; ++r) buf[r] = make_data(DType::float32, numel, r);
    for (int r = 0; r < n; ++r) ptrs.push_back(buf[r].data());
    const Bytes want = reference(DType::float32, ReduceOp::sum, ptrs, numel);
    Waiter w;
    const std::uint64_t id = next_op_id();
    for (int r = 0; r < n; ++r)
      dopt::detail::ring_all_reduce(world(ms, r), id, buf[r].data(), numel, DType::float32, ReduceOp::sum,
                                    w.cb(r));
    w.wait_ok(kBound);
    for (int r = 0; r < n; ++r) CHECK(std::memcmp(buf[r].data(), want.data(), want.size()) == 0);
  }
}

TEST_CASE("ring all_reduce: two ranks exchange whole buffers up to pair_bytes, bitwise as the pipelined path",
          "[tcp][ring]") {
  auto ms = loopback_meshes(2);
  for (DType dt : {DType::float32, DType::bfloat16, DType::int64})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      if (op == ReduceOp::avg && !dopt::is_floating_point(dt)) continue;
      for (std::int64_t numel : {std::int64_t{20000}, std::int64_t{250000}}) {
        INFO("dtype=" << dopt::dtype_name(dt) << " op=" << dopt::reduce_op_name(op) << " numel=" << numel);
        RingOptions pair, piped;
        pair.chunk_bytes = piped.chunk_bytes = 64 << 10;
        pair.pair_bytes = std::size_t(4) << 20;
        piped.small_bytes = piped.pair_bytes = 0;
        std::vector<Bytes> a(2), b(2);
        std::vector<const unsigned char*> ptrs;
        for (int r = 0; r < 2; ++r) a[r] = b[r] = make_data(dt, numel, r);
        for (int r = 0; r < 2; ++r) ptrs.push_back(a[r].data());
        const Bytes want = reference(dt, op, ptrs, numel);
        for (auto* run : {&a, &b}) {
          const RingOptions& opt = run == &a ? pair : piped;
          Waiter w;
          const std::uint64_t id = next_op_id();
          for (int r = 0; r < 2; ++r)
            dopt::detail::ring_all_reduce(world(ms, r), id, (*run)[r].data(), numel, dt, op, w.cb(r), opt);
          w.wait_ok(kBound);
        }
        for (int r = 0; r < 2; ++r) {
          CHECK(a[r] == want);
          CHECK(b[r] == want);
        }
      }
    }
}

TEST_CASE("ring all_reduce: the latency path in pieces (uneven, 3 and 5 ranks, ring order, pre-divisor) is bitwise the pipelined path",
          "[tcp][ring]") {
  // 300007 float32 (1.2 MB): 4 uneven pieces of the whole-buffer exchange,
  // each reduced as it completes; 180001 float64 (1.44 MB): 5 pieces.
  for (int n : {3, 5}) {
    auto ms = loopback_meshes(n);
    for (auto [dt, numel] : {std::pair{DType::float32, std::int64_t{300007}}, std::pair{DType::float64, std::int64_t{180001}}})
      for (auto order : {dopt::ReduceOrder::rank, dopt::ReduceOrder::ring})
        for (std::int64_t pre : {std::int64_t{0}, std::int64_t{3}}) {
          INFO("n=" << n << " dtype=" << dopt::dtype_name(dt) << " ring order=" << (order == dopt::ReduceOrder::ring)
                    << " pre_divisor=" << pre);
          RingOptions whole, piped;
          whole.order = piped.order = order;
          whole.pre_divisor = piped.pre_divisor = pre;
          whole.small_bytes = std::size_t(8) << 20;
          piped.small_bytes = piped.pair_bytes = 0;
          piped.chunk_bytes = 64 << 10;
          std::vector<Bytes> a(n), b(n);
          for (int r = 0; r < n; ++r) a[r] = b[r] = make_data(dt, numel, r);
          for (auto* run : {&a, &b}) {
            const RingOptions& opt = run == &a ? whole : piped;
            Waiter w;
            const std::uint64_t id = next_op_id();
            for (int r = 0; r < n; ++r)
              dopt::detail::ring_all_reduce(world(ms, r), id, (*run)[r].data(), numel, dt, ReduceOp::avg, w.cb(r), opt);
            w.wait_ok(kBound);
          }
          for (int r = 0; r < n; ++r) CHECK(std::memcmp(a[r].data(), b[r].data(), a[r].size()) == 0);
          CHECK(std::memcmp(a[0].data(), a[n - 1].data(), a[0].size()) == 0);
        }
  }
}

TEST_CASE("ring reduce: the root gets ring_all_reduce's bits, the other ranks' buffers are only read", "[tcp][ring]") {
  // Option sets: tiny chunks with a window of 2 (the scratch reused round
  // robin, a non-root owner's next chunk posted once its reduced chunk is
  // sent), tiny chunks with the whole segment in scratch, the latency path in
  // pieces, and the defaults (latency path for small buffers).
  std::vector<RingOptions> opts = option_sets();
  RingOptions whole_window = opts[0];
  whole_window.scratch_bytes = std::size_t(64) << 20;
  RingOptions pieces;
  pieces.small_bytes = std::size_t(8) << 20;
  opts.push_back(whole_window);
  opts.push_back(pieces);
  for (int n : {1, 2, 3, 5}) {
    auto ms = loopback_meshes(n);
    for (const RingOptions& base : opts)
      for (auto [dt, op] : {std::pair{DType::float32, ReduceOp::sum}, std::pair{DType::float16, ReduceOp::avg},
                            std::pair{DType::int64, ReduceOp::max}})
        for (auto order : {dopt::ReduceOrder::rank, dopt::ReduceOrder::ring})
          for (std::int64_t numel : {std::int64_t{0}, std::int64_t{3}, std::int64_t{1001}, std::int64_t{300007}}) {
            RingOptions opt = base;
            opt.order = order;
            opt.pre_divisor = dopt::is_floating_point(dt) && order == dopt::ReduceOrder::ring ? 3 : 0;
            const int root = int(std::uint64_t(numel) % std::uint64_t(n));
            INFO("n=" << n << " dtype=" << dopt::dtype_name(dt) << " op=" << dopt::reduce_op_name(op)
                      << " numel=" << numel << " chunk=" << opt.chunk_bytes << " small=" << opt.small_bytes
                      << " scratch=" << opt.scratch_bytes << " root=" << root);
            std::vector<Bytes> in(n), all(n), red(n);
            for (int r = 0; r < n; ++r) in[r] = all[r] = red[r] = make_data(dt, numel, r, 7);
            Waiter wa, wr;
            const std::uint64_t ida = next_op_id(), idr = next_op_id();
            for (int r = 0; r < n; ++r) {
              dopt::detail::ring_all_reduce(world(ms, r), ida, all[r].data(), numel, dt, op, wa.cb(r), opt);
              dopt::detail::ring_reduce(world(ms, r), idr, red[r].data(), numel, dt, op, root, wr.cb(r), opt);
            }
            wa.wait_ok(kBound);
            wr.wait_ok(kBound);
            for (int r = 0; r < n; ++r) CHECK(red[r] == (r == root ? all[r] : in[r]));
          }
  }
}

TEST_CASE("ring reduce_scatter: uneven segments, separate and aliased inputs", "[tcp][ring]") {
  for (int n : {1, 2, 3, 5}) {
    auto ms = loopback_meshes(n);
    for (const RingOptions& opt : option_sets())
      for (DType dt : k_dtypes)
        for (ReduceOp op : ops_for(dt)) {
          for (std::int64_t base : {0, 1, 777}) {
            std::vector<std::int64_t> counts(n);
            for (int s = 0; s < n; ++s) counts[s] = base == 0 ? 0 : base + s * 3 - (s == 1 ? base : 0);
            // inputs[r][s]: rank r's contribution to segment s
            std::vector<std::vector<Bytes>> in(n, std::vector<Bytes>(n));
            for (int r = 0; r < n; ++r)
              for (int s = 0; s < n; ++s) in[r][s] = make_data(dt, counts[s], r, unsigned(s + 1));
            std::vector<std::vector<const unsigned char*>> seg(n);
            std::vector<Bytes> want(n);
            for (int s = 0; s < n; ++s) {  // before the in-place writes
              for (int r = 0; r < n; ++r) seg[s].push_back(in[r][s].data());
              want[s] = reference(dt, op, seg[s], counts[s]);
            }
            std::vector<Bytes> out(n);
            const std::uint64_t id = next_op_id();
            Waiter w;
            for (int r = 0; r < n; ++r) {
              std::vector<const void*> ptrs;
              for (int s = 0; s < n; ++s) ptrs.push_back(in[r][s].data());
              void* o;
              if (r % 2 == 0) {
                out[r].assign(std::size_t(counts[r]) * dopt::itemsize(dt), 0);
                o = out[r].data();
              } else {
                o = in[r][r].data();  // in place
              }
              dopt::detail::ring_reduce_scatter(world(ms, r), id, ptrs, counts, o, dt, op, w.cb(r), opt);
            }
            w.wait_ok(kBound);
            INFO("n=" << n << " dtype=" << dopt::dtype_name(dt) << " op=" << dopt::reduce_op_name(op)
                      << " base=" << base);
            for (int r = 0; r < n; ++r) CHECK((r % 2 == 0 ? out[r] : in[r][r]) == want[r]);
          }
        }
  }
}

TEST_CASE("ring all_gather: sizes, flat and per-rank outputs, in place", "[tcp][ring]") {
  for (int n : {1, 2, 3, 5}) {
    auto ms = loopback_meshes(n);
    for (const RingOptions& opt : option_sets())
      for (std::size_t bytes : {std::size_t(0), std::size_t(1), std::size_t(13), std::size_t(70001),
                                (std::size_t(1) << 20) + 5}) {
        std::vector<Bytes> in(n), flat(n);
        for (int r = 0; r < n; ++r) in[r] = make_data(DType::uint8, std::int64_t(bytes), r);
        Waiter w;
        const std::uint64_t id = next_op_id();
        for (int r = 0; r < n; ++r) {
          flat[r].assign(bytes * n, 0xAB);
          if (r % 2 == 0) {
            dopt::detail::ring_all_gather(world(ms, r), id, in[r].data(), bytes, flat[r].data(), w.cb(r), opt);
          } else {  // in place: the input already sits in the output
            if (bytes) std::memcpy(flat[r].data() + r * bytes, in[r].data(), bytes);
            std::vector<void*> outs;
            for (int s = 0; s < n; ++s) outs.push_back(flat[r].data() + s * bytes);
            dopt::detail::ring_all_gather(world(ms, r), id, flat[r].data() + r * bytes, bytes, outs, w.cb(r), opt);
          }
        }
        w.wait_ok(kBound);
        Bytes want;
        for (int s = 0; s < n; ++s) want.insert(want.end(), in[s].begin(), in[s].end());
        INFO("n=" << n << " bytes=" << bytes << " chunk=" << opt.chunk_bytes);
        for (int r = 0; r < n; ++r) CHECK(flat[r] == want);
      }
  }
}

TEST_CASE("ring broadcast: every root and size", "[tcp][ring]") {
  for (int n : {1, 2, 3, 5}) {
    auto ms = loopback_meshes(n);
    for (const RingOptions& opt : option_sets())
      for (std::size_t bytes : {std::size_t(0), std::size_t(1), std::size_t(1000), std::size_t(70001),
                                (std::size_t(3) << 20) + 1})
        for (int root = 0; root < n; ++root) {
          std::vector<Bytes> buf(n);
          for (int r = 0; r < n; ++r) buf[r] = make_data(DType::uint8, std::int64_t(bytes), r + 10);
          const Bytes want = buf[root];
          Waiter w;
          const std::uint64_t id = next_op_id();
          for (int r = 0; r < n; ++r)
            dopt::detail::ring_broadcast(world(ms, r), id, buf[r].data(), bytes, root, w.cb(r), opt);
          w.wait_ok(kBound);
          INFO("n=" << n << " bytes=" << bytes << " root=" << root);
          for (int r = 0; r < n; ++r) CHECK(buf[r] == want);
        }
  }
}

TEST_CASE("ring: many collectives in flight, started in different orders per rank", "[tcp][ring]") {
  const int n = 5, K = 24;
  auto ms = loopback_meshes(n);
  const std::int64_t numel = 30011;
  std::vector<std::uint64_t> ids(K);
  for (auto& id : ids) id = next_op_id();
  std::vector<std::vector<Bytes>> buf(K, std::vector<Bytes>(n)), in(K, std::vector<Bytes>(n));
  std::vector<Bytes> want(K);
  for (int k = 0; k < K; ++k) {
    std::vector<const unsigned char*> ptrs;
    for (int r = 0; r < n; ++r) in[k][r] = buf[k][r] = make_data(DType::float32, numel + k, r, unsigned(k));
    for (int r = 0; r < n; ++r) ptrs.push_back(in[k][r].data());
    want[k] = reference(DType::float32, ReduceOp::sum, ptrs, numel + k);
  }
  RingOptions opt;
  opt.chunk_bytes = 4096;
  opt.small_bytes = 0;
  Waiter w;
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      for (int j = 0; j < K; ++j) {
        const int k = r % 2 ? K - 1 - j : j;  // odd ranks start them in reverse
        dopt::detail::ring_all_reduce(world(ms, r), ids[k], buf[k][r].data(), numel + k, DType::float32,
                                      ReduceOp::sum, w.cb(k * n + r), opt);
      }
    });
  for (auto& t : ts) t.join();
  w.wait_ok(kBound);
  for (int k = 0; k < K; ++k)
    for (int r = 0; r < n; ++r) CHECK(buf[k][r] == want[k]);
}

TEST_CASE("ring: subgroups of one mesh run concurrently", "[tcp][ring]") {
  auto ms = loopback_meshes(5);
  const std::vector<std::vector<int>> groups = {{1, 3, 4}, {0, 2}};
  const std::int64_t numel = 100003;
  Waiter w;
  std::vector<std::vector<Bytes>> buf(2);
  std::vector<Bytes> want(2);
  RingOptions opt;
  opt.chunk_bytes = 65536;
  for (int gi = 0; gi < 2; ++gi) {
    const auto& g = groups[gi];
    std::vector<const unsigned char*> ptrs;
    buf[gi].resize(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) buf[gi][i] = make_data(DType::bfloat16, numel, g[i]);
    for (auto& b : buf[gi]) ptrs.push_back(b.data());
    want[gi] = reference(DType::bfloat16, ReduceOp::avg, ptrs, numel);
  }
  const std::uint64_t id = next_op_id();  // same id in both groups: their tags never meet
  for (int gi = 0; gi < 2; ++gi)
    for (std::size_t i = 0; i < groups[gi].size(); ++i)
      dopt::detail::ring_all_reduce(group_of(ms, groups[gi], int(i)), id, buf[gi][i].data(), numel,
                                    DType::bfloat16, ReduceOp::avg, w.cb(gi * 5 + int(i)), opt);
  w.wait_ok(kBound);
  for (int gi = 0; gi < 2; ++gi)
    for (auto& b : buf[gi]) CHECK(b == want[gi]);
}

namespace {

enum class Kind { all_reduce_mid_op, all_gather_absent, broadcast_absent };

void lost_peer_case(int n, Kind kind) {
  const int dead = n == 3 ? 1 : 3;
  auto ms = loopback_meshes(n);
  const std::int64_t numel = std::int64_t(2) << 20;
  std::vector<Bytes> buf(n);
  for (int r = 0; r < n; ++r) buf[r] = make_data(DType::float32, numel, r);
  const std::string dead_lost = "rank " + std::to_string(dead) + " lost";
  // Every rank but the dead one failed with PeerLostError naming the
  // collective `what` and the dead rank.
  auto others_lost = [&](const std::vector<std::exception_ptr>& errs, const std::string& what) {
    for (int r = 0; r < n; ++r) {
      if (r == dead) continue;
      INFO("rank " << r << ": " << (errs[r] ? message_of(errs[r]) : "no error"));
      REQUIRE(errs[r]);
      CHECK(is<dopt::PeerLostError>(errs[r]));
      CHECK_THAT(message_of(errs[r]), Catch::Contains(what) && Catch::Contains(dead_lost));
    }
  };
  const std::uint64_t id = next_op_id();
  Waiter w;
  if (kind == Kind::all_reduce_mid_op) {
    RingOptions opt;
    opt.chunk_bytes = 256 << 10;
    for (int r = 0; r < n; ++r)
      dopt::detail::ring_all_reduce(world(ms, r), id, buf[r].data(), numel, DType::float32,
                                    ReduceOp::sum, w.cb(r), opt);
    ms[dead]->close();  // while the collective runs everywhere
    auto errs = w.wait_by_slot(kBound);
    REQUIRE(errs[dead]);
    CHECK(is<dopt::StateError>(errs[dead]));
    others_lost(errs, "all_reduce (tcp)");
  } else if (kind == Kind::all_gather_absent) {
    const std::size_t bytes = 3 << 20;
    std::vector<Bytes> out(n, Bytes(bytes * n));
    ms[dead]->close();
    for (int r = 0; r < n; ++r)
      if (r != dead)
        dopt::detail::ring_all_gather(world(ms, r), id, buf[r].data(), bytes, out[r].data(), w.cb(r));
    auto errs = w.wait_by_slot(kBound);
    others_lost(errs, "all_gather (tcp)");
  } else {
    ms[dead]->close();
    const std::size_t bytes = 4 << 20;
    for (int r = 0; r < n; ++r)
      if (r != dead) dopt::detail::ring_broadcast(world(ms, r), id, buf[r].data(), bytes, 0, w.cb(r));
    auto errs = w.wait_by_slot(kBound);
    for (int r = 0; r < n; ++r) {
      if (r == dead) continue;
      INFO("rank " << r << ": " << (errs[r] ? message_of(errs[r]) : "no error"));
      if (r > dead) REQUIRE(errs[r]);  // downstream of the dead rank in the chain
      if (errs[r]) {
        CHECK(is<dopt::PeerLostError>(errs[r]));
        CHECK_THAT(message_of(errs[r]), Catch::Contains(dead_lost));
      }
    }
    if (n == 5) CHECK_FALSE(errs[1]);  // upstream, and not sending to the dead rank
  }

  // The healthy ranks' connections stayed in step: a collective among them works.
  std::vector<int> alive;
  for (int r = 0; r < n; ++r)
    if (r != dead) alive.push_back(r);
  std::vector<Bytes> b2(alive.size());
  std::vector<const unsigned char*> ptrs;
  for (std::size_t i = 0; i < alive.size(); ++i) b2[i] = make_data(DType::float64, 50001, alive[i], 9);
  for (auto& b : b2) ptrs.push_back(b.data());
  const Bytes want = reference(DType::float64, ReduceOp::sum, ptrs, 50001);
  RingOptions opt;
  opt.chunk_bytes = 8192;
  Waiter w2;
  const std::uint64_t id2 = next_op_id();
  for (std::size_t i = 0; i < alive.size(); ++i)
    dopt::detail::ring_all_reduce(group_of(ms, alive, int(i)), id2, b2[i].data(), 50001, DType::float64,
                                  ReduceOp::sum, w2.cb(int(i)), opt);
  w2.wait_ok(kBound);
  for (auto& b : b2) CHECK(b == want);
}

}  // namespace

TEST_CASE("ring: a peer closed mid-operation fails every other rank with PeerLostError naming it",
          "[tcp][ring]") {
  for (int n : {3, 5}) {
    INFO("n=" << n);
    lost_peer_case(n, Kind::all_reduce_mid_op);
  }
}

TEST_CASE("ring: an absent peer fails all_gather everywhere and broadcast downstream, no hang",
          "[tcp][ring]") {
  for (int n : {3, 5}) {
    INFO("n=" << n);
    lost_peer_case(n, Kind::all_gather_absent);
    lost_peer_case(n, Kind::broadcast_absent);
  }
}

TEST_CASE("ring: argument errors throw synchronously", "[tcp][ring]") {
  auto ms = loopback_meshes(2);
  float x = 0;
  auto noop = [](std::exception_ptr) {};
  CHECK_THROWS_AS(dopt::detail::ring_all_reduce(world(ms, 0), 1, &x, 1, DType::bool_, ReduceOp::sum, noop),
                  dopt::DTypeError);
  CHECK_THROWS_AS(dopt::detail::ring_all_reduce(world(ms, 0), 1, &x, 1, DType::int32, ReduceOp::avg, noop),
                  dopt::DTypeError);
  CHECK_THROWS_AS(dopt::detail::ring_all_reduce(RingGroup{ms[0].get(), {0, 1}, 1}, 1, &x, 1, DType::float32,
                                                ReduceOp::sum, noop),
                  dopt::ValueError);
  CHECK_THROWS_AS(dopt::detail::ring_all_reduce(RingGroup{ms[0].get(), {0, 0}, 0}, 1, &x, 1, DType::float32,
                                                ReduceOp::sum, noop),
                  dopt::ValueError);
  CHECK_THROWS_AS(dopt::detail::ring_broadcast(world(ms, 0), 1, &x, 4, 2, noop), dopt::ValueError);
  CHECK_THROWS_AS(dopt::detail::ring_all_gather(world(ms, 0), 1, &x, 4, std::vector<void*>{&x}, noop),
                  dopt::ValueError);
}

TEST_CASE("ring reduce: argument errors throw synchronously", "[tcp][ring]") {
  auto ms = loopback_meshes(2);
  float x = 0;
  auto noop = [](std::exception_ptr) {};
  CHECK_THROWS_AS(dopt::detail::ring_reduce(world(ms, 0), 1, &x, 1, DType::float32, ReduceOp::sum, 2, noop),
                  dopt::ValueError);
  CHECK_THROWS_AS(dopt::detail::ring_reduce(world(ms, 0), 1, &x, 1, DType::float32, ReduceOp::sum, -1, noop),
                  dopt::ValueError);
  CHECK_THROWS_AS(dopt::detail::ring_reduce(world(ms, 0), 1, &x, 1, DType::bool_, ReduceOp::sum, 0, noop),
                  dopt::DTypeError);
  CHECK_THROWS_AS(dopt::detail::ring_reduce(world(ms, 0), 1, nullptr, 1, DType::float32, ReduceOp::sum, 0, noop),
                  dopt::ValueError);
}

TEST_CASE(
    "ring reduce: an absent peer (a non-root or the root) fails every other rank, no hang, and the survivors "
    "reduce afterwards",
    "[tcp][ring]") {
  for (int n : {3, 5}) {
    const int dead = n == 3 ? 1 : 3;
    for (int root : {0, dead}) {
      INFO("n=" << n << " root=" << root);
      auto ms = loopback_meshes(n);
      // 2M floats, chunks of 256 KiB, a window of 2: a non-root owner posts
      // its later chunks as its reduced ones are sent.
      const std::int64_t numel = std::int64_t(2) << 20;
      RingOptions opt;
      opt.chunk_bytes = 256 << 10;
      opt.window = 2;
      opt.scratch_bytes = 0;
      std::vector<Bytes> buf(n);
      for (int r = 0; r < n; ++r) buf[r] = make_data(DType::float32, numel, r);
      ms[dead]->close();
      Waiter w;
      const std::uint64_t id = next_op_id();
      for (int r = 0; r < n; ++r)
        if (r != dead)
          dopt::detail::ring_reduce(world(ms, r), id, buf[r].data(), numel, DType::float32, ReduceOp::sum, root,
                                    w.cb(r), opt);
      auto errs = w.wait_by_slot(kBound);
      for (int r = 0; r < n; ++r) {
        if (r == dead) continue;
        INFO("rank " << r << ": " << (errs[r] ? message_of(errs[r]) : "no error"));
        REQUIRE(errs[r]);
        CHECK(is<dopt::PeerLostError>(errs[r]));
        CHECK_THAT(message_of(errs[r]),
                   Catch::Contains("reduce (tcp)") && Catch::Contains("rank " + std::to_string(dead) + " lost"));
      }
      // The survivors' connections stayed in step: a reduce among them works.
      std::vector<int> alive;
      for (int r = 0; r < n; ++r)
        if (r != dead) alive.push_back(r);
      std::vector<Bytes> in(alive.size()), b2(alive.size());
      std::vector<const unsigned char*> ptrs;
      for (std::size_t i = 0; i < alive.size(); ++i) in[i] = b2[i] = make_data(DType::float64, 50001, alive[i], 9);
      for (auto& b : in) ptrs.push_back(b.data());
      const Bytes want = reference(DType::float64, ReduceOp::sum, ptrs, 50001);
      RingOptions small_chunks;
      small_chunks.chunk_bytes = 8192;
      Waiter w2;
      const std::uint64_t id2 = next_op_id();
      for (std::size_t i = 0; i < alive.size(); ++i)
        dopt::detail::ring_reduce(group_of(ms, alive, int(i)), id2, b2[i].data(), 50001, DType::float64, ReduceOp::sum,
                                  1, w2.cb(int(i)), small_chunks);
      w2.wait_ok(kBound);
      for (std::size_t i = 0; i < alive.size(); ++i) CHECK(b2[i] == (i == 1 ? want : in[i]));
    }
  }
}
