// read_into_all and populate_pages (runtime/internal/read_ahead.hpp): the
// many-tensor read under the consolidated ZeRO load.
#include "dopt/runtime/internal/read_ahead.hpp"

#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dopt/runtime/error.hpp"

namespace fs = std::filesystem;
using namespace dopt;

namespace {

struct TempFile {
  fs::path path;
  TempFile() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("dopt_read_ahead_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".safetensors");
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

/// n float32 tensors "t<k>" of sizes[k] elements, each element a function of (k, i) that is not a simple pattern.
std::map<std::string, Tensor> make_tensors(const std::vector<std::int64_t>& sizes) {
  std::map<std::string, Tensor> out;
  std::uint32_t x = 0x9e3779b9u;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    Tensor t = Tensor::empty({sizes[k]}, DType::float32);
    auto* p = static_cast<std::uint32_t*>(t.data_ptr());
    for (std::int64_t i = 0; i < sizes[k]; ++i) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      p[i] = x;
    }
    out.emplace("t" + std::to_string(k), t);
  }
  out.emplace("step", Tensor::full({}, 7.0, DType::int64));
  return out;
}

/// Fresh destinations for `names` (in this order) shaped as the file's entries.
std::vector<std::pair<std::string, Tensor>> destinations(const SafetensorsReader& rd,
                                                         const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& n : names) {
    const SafetensorsEntry& e = rd.entry(n);
    out.emplace_back(n, Tensor::empty(e.shape, e.dtype));
  }
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("read_into_all reads every tensor bit for bit, with and without the mapping thread",
          "[safetensors][checkpoint]") {
  // 24 MiB in all (the helper maps ahead: 8 MiB or more) and 0.4 MiB (all on the calling thread).
  for (const std::vector<std::int64_t>& sizes :
       {std::vector<std::int64_t>{1 << 20, 700'001, 3 << 19, 1 << 18, 1'000'003, 5 << 17, 2 << 20},
        std::vector<std::int64_t>{100'000, 3, 1}}) {
    TempFile f;
    const auto src = make_tensors(sizes);
    write_safetensors(f.path.string(), src);
    SafetensorsReader rd(f.path.string());
    std::vector<std::string> names;
    for (const auto& [n, t] : src) names.push_back(n);
    // File order, then reversed (the helper then maps ahead in an order the file does not have).
    for (bool reversed : {false, true}) {
      INFO("tensors " << sizes.size() << (reversed ? ", reversed" : ""));
      std::vector<std::string> order = names;
      if (reversed) order.assign(names.rbegin(), names.rend());
      const auto dst = destinations(rd, order);
      detail::read_into_all(rd, dst);
      for (const auto& [n, t] : dst) CHECK(same_bytes(t, src.at(n)));
    }
  }
}

TEST_CASE("read_into_all stops at a damaged tensor with its error, and an unknown name is a KeyError",
          "[safetensors][checkpoint]") {
  TempFile f;
  const auto src = make_tensors({1 << 20, 1 << 20, 1 << 20, 1 << 20});  // 16 MiB: the helper runs
  write_safetensors(f.path.string(), src);
  std::vector<std::string> names = {"t0", "t1", "t2", "t3"};
  std::size_t damaged_at = 0;
  {
    SafetensorsReader rd(f.path.string());
    damaged_at = rd.data_offset() + rd.entry("t2").begin + 12345;
  }
  std::string bytes;
  {
    std::ifstream in(f.path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[damaged_at] = static_cast<char>(bytes[damaged_at] ^ 0x10);
  {
    std::ofstream out(f.path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  SafetensorsReader rd(f.path.string());
  const auto dst = destinations(rd, names);
  CHECK_THROWS_WITH(detail::read_into_all(rd, dst), Catch::Contains("tensor 't2' does not match its checksum"));
  CHECK(same_bytes(dst[0].second, src.at("t0")));  // read before the damaged one
  CHECK(same_bytes(dst[1].second, src.at("t1")));
  auto unknown = destinations(rd, {"t0"});
  unknown.emplace_back("t9", Tensor::empty({4}, DType::float32));
  CHECK_THROWS_AS(detail::read_into_all(rd, unknown), KeyError);
}

TEST_CASE("populate_pages maps a fresh range's pages and leaves small ranges alone", "[safetensors][checkpoint]") {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t n = 64 * page;
  void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(m != MAP_FAILED);
  auto resident = [&](std::size_t first, std::size_t count) {
    std::vector<unsigned char> v(n / page);
    REQUIRE(::mincore(m, n, v.data()) == 0);
    std::size_t r = 0;
    for (std::size_t i = first; i < first + count; ++i) r += v[i] & 1;
    return r;
  };
  CHECK(resident(0, 64) == 0);
  detail::populate_pages(static_cast<char*>(m) + 40 * page, 8 * page);  // under 64 KiB: left alone
  CHECK(resident(0, 64) == 0);
  // From the middle of page 1 to the middle of page 33: pages 2..32 are whole.
  detail::populate_pages(static_cast<char*>(m) + page + 100, 32 * page);
  const bool kernel_populates = resident(2, 31) > 0;  // MADV_POPULATE_WRITE: Linux 5.14
  if (kernel_populates) {
    CHECK(resident(2, 31) == 31);
    CHECK(resident(1, 1) == 0);  // partial pages are not touched
    CHECK(resident(33, 31) == 0);
  }
  ::munmap(m, n);
}
