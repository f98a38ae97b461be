#include "dopt/runtime/safetensors.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/state_dict.hpp"

namespace fs = std::filesystem;
using namespace dopt;

namespace {

/// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("dopt_safetensors_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string u64le(std::uint64_t v) {
  std::string s(8, '\0');
  for (int k = 0; k < 8; ++k) s[k] = static_cast<char>(v >> (8 * k));
  return s;
}

/// A file from a header text and a data section.
std::string make_file(const std::string& header, const std::string& data = {}) {
  return u64le(header.size()) + header + data;
}

SafetensorsFile parse(const std::string& bytes) { return parse_safetensors(bytes.data(), bytes.size(), "test"); }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// One tensor of every dtype, plus 0-d and empty ones, with non-trivial values.
std::map<std::string, Tensor> every_dtype() {
  std::map<std::string, Tensor> m;
  m["f32"] = Tensor::from_vector<float>({1.5f, -2.25f, 3.0e-38f, 1e30f, -0.0f, 7.0f}, {2, 3});
  m["f64"] = Tensor::from_vector<double>({3.141592653589793, -1e-300, 2.5}, {3});
  m["f16"] = Tensor::full({2, 2}, 0.333, DType::float16);
  m["bf16"] = Tensor::full({3}, -12.75, DType::bfloat16);
  m["i8"] = Tensor::from_vector<std::int8_t>({-128, 0, 127}, {3});
  m["u8"] = Tensor::from_vector<std::uint8_t>({0, 1, 255, 42}, {2, 2});
  m["i32"] = Tensor::from_vector<std::int32_t>({-2147483647 - 1, 5, 2147483647}, {3, 1});
  m["i64"] = Tensor::from_vector<std::int64_t>({-(std::int64_t(1) << 62), 9}, {2});
  m["bool"] = Tensor::from_vector<std::uint8_t>({0, 1, 1}, {3}).to(DType::bool_);
  m["scalar_f32"] = Tensor::scalar(8.0, DType::float32);
  m["scalar_i64"] = Tensor::scalar(-3.0, DType::int64);
  m["empty_f32"] = Tensor::empty({0}, DType::float32);
  m["empty_2d_i32"] = Tensor::empty({3, 0}, DType::int32);
  return m;
}

void check_same(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO("tensor " << name);
    auto it = b.find(name);
    REQUIRE(it != b.end());
    CHECK(it->second.dtype() == t.dtype());
    CHECK(it->second.shape() == t.shape());
    CHECK(it->second.equal(t));
  }
}

/// A small valid file used by the truncation and mutation loops.
std::string small_valid_file() {
  std::map<std::string, Tensor> m;
  m["a"] = Tensor::from_vector<float>({1.f, 2.f, 3.f}, {3});
  m["b"] = Tensor::scalar(4.0, DType::int64);
  m["c"] = Tensor::from_vector<std::uint8_t>({1, 0}, {2}).to(DType::bool_);
  m["d"] = Tensor::from_vector<double>({-1.0, 0.5}, {1, 2});
  return serialize_safetensors(m, {{"format", "x"}});
}

}  // namespace

TEST_CASE("safetensors round trip of every dtype, 0-d and empty tensors", "[safetensors]") {
  const auto tensors = every_dtype();
  const std::map<std::string, std::string> meta{{"format", "dopt-trace/1"}, {"note", "h\u00e9llo"}};

  SECTION("in memory") {
    const std::string bytes = serialize_safetensors(tensors, meta);
    const std::uint64_t n = [&] {
      std::uint64_t v = 0;
      for (int k = 7; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(bytes[k]);
      return v;
    }();
    CHECK(n % 8 == 0);
    SafetensorsFile f = parse(bytes);
    check_same(tensors, f.tensors);
    CHECK(f.metadata == meta);
    CHECK(f.tensors.at("scalar_f32").dim() == 0);
    CHECK(f.tensors.at("scalar_f32").item() == 8.0);
    CHECK(f.tensors.at("empty_2d_i32").numel() == 0);
    // deterministic
    CHECK(serialize_safetensors(tensors, meta) == bytes);
  }
  SECTION("through a file, whole and streaming") {
    TempDir dir;
    const std::string path = dir.file("all.safetensors");
    write_safetensors(path, tensors, meta);
    CHECK(slurp(path) == serialize_safetensors(tensors, meta));
    // no temporary file left behind
    CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
    SafetensorsFile f = read_safetensors(path);
    check_same(tensors, f.tensors);
    CHECK(f.metadata == meta);

    SafetensorsReader r(path);
    REQUIRE(r.entries().size() == tensors.size());
    CHECK(r.metadata() == meta);
    CHECK(r.contains("f64"));
    CHECK_FALSE(r.contains("nope"));
    CHECK_THROWS_AS(r.read("nope"), KeyError);
    const SafetensorsEntry& e = r.entry("i32");
    CHECK(e.dtype == DType::int32);
    CHECK(e.shape == Shape{3, 1});
    CHECK(e.nbytes() == 12);
    CHECK(r.read("i32").equal(tensors.at("i32")));
    CHECK(r.read("f16").equal(tensors.at("f16")));  // any order, repeatable
    CHECK(r.read("i32").equal(tensors.at("i32")));
    for (std::size_t k = 1; k < r.entries().size(); ++k) CHECK(r.entries()[k - 1].name < r.entries()[k].name);
    // read_into a preallocated buffer of another shape, same element count
    Tensor flat = Tensor::zeros({6}, DType::float32);
    r.read_into("f32", flat);
    CHECK(flat.view({2, 3}).equal(tensors.at("f32")));
    CHECK_THROWS_AS(r.read_into("f32", Tensor::zeros({5}, DType::float32)), ShapeError);
    CHECK_THROWS_AS(r.read_into("f32", Tensor::zeros({6}, DType::float64)), DTypeError);
    CHECK_THROWS_AS(r.read_into("nope", flat), KeyError);
  }
  SECTION("overwriting an existing file") {
    TempDir dir;
    const std::string path = dir.file("x.safetensors");
    write_safetensors(path, {{"a", Tensor::scalar(1.0)}});
    write_safetensors(path, {{"b", Tensor::scalar(2.0)}});
    SafetensorsFile f = read_safetensors(path);
    REQUIRE(f.tensors.size() == 1);
    CHECK(f.tensors.at("b").item() == 2.0);
  }
}

TEST_CASE("safetensors writer rejects what it cannot write", "[safetensors]") {
  CHECK_THROWS_AS(serialize_safetensors({{"", Tensor::scalar(1.0)}}), ValueError);
  CHECK_THROWS_AS(serialize_safetensors({{"__metadata__", Tensor::scalar(1.0)}}), ValueError);
  CHECK_THROWS_AS(serialize_safetensors({{"a", Tensor()}}), ValueError);
  CHECK_THROWS_AS(serialize_safetensors({}, {{"k", std::string("\xff\xfe")}}), IOError);
  CHECK_THROWS_AS(write_safetensors("/nonexistent-dir-dopt/x.safetensors", {{"a", Tensor::scalar(1.0)}}), IOError);
  CHECK_THROWS_AS(read_safetensors("/nonexistent-dir-dopt/x.safetensors"), IOError);
  CHECK_THROWS_AS(SafetensorsReader("/nonexistent-dir-dopt/x.safetensors"), IOError);
  // an empty map is a valid (tiny) file
  SafetensorsFile f = parse(serialize_safetensors({}));
  CHECK(f.tensors.empty());
  CHECK(f.metadata.empty());
}

TEST_CASE("safetensors reads a conformance case file", "[safetensors]") {
  const std::string path = std::string(DOPT_SHARED_DIR) + "/conformance/cases/adam_default/tensors.safetensors";
  if (!fs::exists(path)) {
    WARN("no conformance case at " << path << "; skipped");
    return;
  }
  SafetensorsFile f = read_safetensors(path);
  CHECK(f.metadata.at("format") == "dopt-trace/1");
  const Tensor& init0 = f.tensors.at("init.0");
  CHECK(init0.dtype() == DType::float32);
  CHECK(init0.shape() == Shape{4, 3});
  CHECK(init0.at(0) == static_cast<double>(-0.7401533126831055f));
  const Tensor& step = f.tensors.at("state.0.0.step");
  CHECK(step.dim() == 0);
  CHECK(step.item() == 8.0);
  CHECK(f.tensors.count("param.7.0.3") == 1);
  CHECK(f.tensors.count("state.0.3.exp_avg_sq") == 1);
  // parse_safetensors of the bytes agrees, and a rewrite reads back equal
  const std::string bytes = slurp(path);
  SafetensorsFile g = parse_safetensors(bytes.data(), bytes.size(), path);
  check_same(f.tensors, g.tensors);
  check_same(f.tensors, parse(serialize_safetensors(f.tensors, f.metadata)).tensors);
}

TEST_CASE("safetensors rejects malformed input with IOError", "[safetensors]") {
  const std::string f4(4, '\0');    // data for one float
  const std::string f12(12, '\0');  // data for three floats
  struct Case {
    const char* what;
    std::string bytes;
  };
  const std::vector<Case> cases = {
      {"shorter than the length prefix", std::string("\x05\x00\x00", 3)},
      {"empty file", std::string()},
      {"header length > file size", u64le(1000) + "{}"},
      {"absurd header length", u64le(std::uint64_t(1) << 62) + "{}"},
      {"header length just above the cap", u64le(kSafetensorsMaxHeader + 1) + "{}"},
      {"empty header", make_file("")},
      {"invalid JSON", make_file("{not json")},
      {"trailing garbage after JSON", make_file("{} x")},
      {"invalid UTF-8", make_file("{\"__metadata__\":{\"k\":\"\xff\"}}")},
      {"non-object header", make_file("[1,2,3]")},
      {"number header", make_file("42")},
      {"entry not an object", make_file(R"({"a":[1]})")},
      {"missing dtype", make_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", f4)},
      {"missing shape", make_file(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", f4)},
      {"missing data_offsets", make_file(R"({"a":{"dtype":"F32","shape":[1]}})", f4)},
      {"dtype not a string", make_file(R"({"a":{"dtype":5,"shape":[1],"data_offsets":[0,4]}})", f4)},
      {"unknown dtype", make_file(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,4]}})", f4)},
      {"torch dtype name is not a safetensors name",
       make_file(R"({"a":{"dtype":"float32","shape":[1],"data_offsets":[0,4]}})", f4)},
      {"unknown field", make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", f4)},
      {"shape not an array", make_file(R"({"a":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", f4)},
      {"shape with a float", make_file(R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", f4)},
      {"shape with a string", make_file(R"({"a":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", f4)},
      {"negative shape", make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", f4)},
      {"overflowing shape",
       make_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,4]}})",
                 f4)},
      {"shape overflowing bytes only",
       make_file(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", std::string(8, '\0'))},
      {"dimension above int64", make_file(R"({"a":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,1]}})",
                                           std::string(1, '\0'))},
      {"dimension beyond uint64",
       make_file(R"({"a":{"dtype":"U8","shape":[99999999999999999999999],"data_offsets":[0,1]}})", std::string(1, '\0'))},
      {"data_offsets not an array", make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":4}})", f4)},
      {"data_offsets with one element", make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", f4)},
      {"data_offsets with three elements",
       make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", f4)},
      {"data_offsets with a string", make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":["0",4]}})", f4)},
      {"negative data offset", make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", f4)},
      {"end < begin", make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", f4)},
      {"offsets outside the data section", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f4)},
      {"huge offsets", make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551611,18446744073709551615]}})", f4)},
      {"byte count != numel*itemsize", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", f4)},
      {"byte count != itemsize for 0-d", make_file(R"({"a":{"dtype":"F64","shape":[],"data_offsets":[0,4]}})", f4)},
      {"overlapping tensors",
       make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 f12)},
      {"identical ranges",
       make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
                 f4)},
      {"metadata value not a string", make_file(R"({"__metadata__":{"a":1}})")},
      {"metadata value an object", make_file(R"({"__metadata__":{"a":{}}})")},
      {"metadata not an object", make_file(R"({"__metadata__":"x"})")},
      {"duplicate tensor keys",
       make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 std::string(8, '\0'))},
      {"duplicate field", make_file(R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f4)},
      {"duplicate metadata key", make_file(R"({"__metadata__":{"k":"1","k":"2"}})")},
      {"truncated data", make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})", f4)},
      {"bool byte other than 0/1", make_file(R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
                                             std::string("\x01\x02", 2))},
      {"deep nesting", make_file(std::string(1000, '[') + std::string(1000, ']'))},
      {"deep nesting in metadata", make_file("{\"__metadata__\":" + std::string(100, '[') + std::string(100, ']') + "}")},
  };
  TempDir dir;
  for (const auto& c : cases) {
    INFO("case: " << c.what);
    CHECK_THROWS_AS(parse(c.bytes), IOError);
    // the file readers agree, and name the file in the message
    const std::string path = dir.file("bad.safetensors");
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(c.bytes.data(), static_cast<std::streamsize>(c.bytes.size()));
    }
    try {
      read_safetensors(path);
      FAIL("read_safetensors accepted it");
    } catch (const IOError& e) {
      CHECK(std::string(e.what()).find(path) != std::string::npos);
    }
  }
  // message for one case names the problem
  try {
    parse(make_file(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,4]}})", f4));
    FAIL("accepted an unknown dtype");
  } catch (const IOError& e) {
    CHECK(std::string(e.what()).find("unknown dtype 'F128'") != std::string::npos);
    CHECK(std::string(e.what()).find("test") != std::string::npos);
  }
}

TEST_CASE("safetensors tolerates padding, holes and any entry order", "[safetensors]") {
  // entries out of offset order, a hole between them, header padded with spaces
  const std::string data = std::string("\x01\x00\x00\x00", 4) + "HOLE" + std::string("\x02\x00\x00\x00", 4);
  SafetensorsFile f = parse(make_file(
      R"({"z":{"dtype":"I32","shape":[],"data_offsets":[0,4]},"a":{"dtype":"I32","shape":[1],"data_offsets":[8,12]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}       )",
      data));
  CHECK(f.tensors.at("z").item() == 1.0);
  CHECK(f.tensors.at("a").item() == 2.0);
  CHECK(f.tensors.at("e").numel() == 0);
}

TEST_CASE("safetensors: every truncation of a valid file throws IOError", "[safetensors]") {
  const std::string full = small_valid_file();
  REQUIRE_NOTHROW(parse(full));
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  for (std::size_t len = 0; len < full.size(); ++len) {
    INFO("prefix length " << len << " of " << full.size());
    const std::string prefix = full.substr(0, len);
    CHECK_THROWS_AS(parse(prefix), IOError);
    if (len % 7 == 0) {  // the file path too (a sample, to keep the test fast)
      {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(prefix.data(), static_cast<std::streamsize>(prefix.size()));
      }
      CHECK_THROWS_AS(read_safetensors(path), IOError);
    }
  }
}

namespace {

/// DOPT_CHECKSUMS set to value for the scope (restored after).
struct ChecksumEnv {
  std::string old;
  bool had = false;
  explicit ChecksumEnv(const char* value) {
    if (const char* v = std::getenv("DOPT_CHECKSUMS")) had = true, old = v;
    ::setenv("DOPT_CHECKSUMS", value, 1);
  }
  ~ChecksumEnv() {
    if (had) ::setenv("DOPT_CHECKSUMS", old.c_str(), 1);
    else ::unsetenv("DOPT_CHECKSUMS");
  }
};

/// Notes raised in the scope.
struct CaptureNotices {
  std::vector<std::string> notes;
  NoticeHandler old;
  CaptureNotices() { old = set_notice_handler([this](const std::string& t) { notes.push_back(t); }); }
  ~CaptureNotices() { set_notice_handler(old); }
};

/// Flips random bytes (and sometimes truncates) 4000 times; counts what parsed.
std::pair<int, int> flip_bytes(const std::string& valid) {
  std::uint64_t s = 0x9e3779b97f4a7c15ull;
  auto next = [&] {  // xorshift64*
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545f4914f6cdd1dull;
  };
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string m = valid;
    const int flips = 1 + static_cast<int>(next() % 3);
    for (int k = 0; k < flips; ++k) {
      std::size_t pos;
      // bias towards the header and the length prefix
      if (next() % 4 == 0) pos = next() % 8;
      else pos = next() % m.size();
      const auto x = static_cast<unsigned char>(1 + next() % 255);
      m[pos] = static_cast<char>(static_cast<unsigned char>(m[pos]) ^ x);
    }
    if (iter % 10 == 0) m.resize(next() % (m.size() + 1));  // sometimes truncate as well
    try {
      SafetensorsFile f = parse(m);
      for (const auto& [name, t] : f.tensors) (void)t.nbytes();
      ++parsed;
    } catch (const dopt::Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL("iteration " << iter << ": non-dopt exception: " << e.what());
    }
  }
  return {parsed, rejected};
}

}  // namespace

TEST_CASE("safetensors: random byte flips parse or throw dopt::Error", "[safetensors]") {
  SECTION("with checksums every damaged file is refused") {
    const auto [parsed, rejected] = flip_bytes(small_valid_file());
    CHECK(parsed == 0);
    CHECK(rejected == 4000);
  }
  SECTION("without checksums (DOPT_CHECKSUMS=off) the parser alone stays sound") {
    ChecksumEnv off("off");
    const std::string valid = small_valid_file();
    CHECK(valid.find(kSafetensorsChecksumKey) == std::string::npos);
    const auto [parsed, rejected] = flip_bytes(valid);
    CHECK(rejected > 0);
    CHECK(parsed > 0);  // flips in the data section leave a valid file
  }
}

TEST_CASE("safetensors: a flipped bit in any tensor is refused, naming the file and the tensor", "[safetensors][checksum]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const auto tensors = every_dtype();
  write_safetensors(path, tensors, {{"step", "50"}});
  const std::string good = slurp(path);
  CHECK(read_safetensors(path).verified);
  SafetensorsReader clean(path);
  CHECK(clean.verified());
  CHECK(clean.metadata().count(kSafetensorsChecksumKey) == 0);  // not returned to callers
  int flipped = 0;
  for (const SafetensorsEntry& e : clean.entries()) {
    if (e.nbytes() == 0) continue;
    for (int bit : {0, 7}) {
      INFO(e.name << " bit " << bit);
      std::string bad = good;
      const std::size_t pos = clean.data_offset() + e.begin + (e.nbytes() - 1) / 2;
      bad[pos] = static_cast<char>(static_cast<unsigned char>(bad[pos]) ^ (1u << bit));
      {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(bad.data(), static_cast<std::streamsize>(bad.size()));
      }
      const std::string want = path + ": tensor '" + e.name + "' does not match its checksum";
      try {
        (void)read_safetensors(path);
        FAIL("read_safetensors accepted a flipped bit");
      } catch (const IOError& err) {
        CHECK_THAT(err.what(), Catch::Contains(want));
        CHECK_THAT(err.what(), Catch::Contains("the file is corrupt"));
      }
      SafetensorsReader r(path);  // the header is intact
      CHECK_THROWS_WITH(r.read(e.name), Catch::Contains(want));
      for (const SafetensorsEntry& other : r.entries())
        if (other.name != e.name) CHECK_NOTHROW(r.read(other.name));  // only the damaged one fails
      CHECK_THROWS_WITH(parse_safetensors(bad.data(), bad.size(), "in-memory copy"),
                        Catch::Contains("in-memory copy: tensor '" + e.name + "' does not match its checksum"));
      ++flipped;
    }
  }
  CHECK(flipped >= 20);
}

TEST_CASE("safetensors: a changed header is refused even when it stays valid JSON", "[safetensors][checksum]") {
  const std::string good = serialize_safetensors({{"w", Tensor::from_vector<float>({1.f, 2.f}, {2})}}, {{"step", "50"}});
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"50\"", "\"51\""},                 // metadata value
           {"\"F32\"", "\"I32\""},               // dtype of the same size
           {"\"shape\":[2]", "\"shape\":[1]"}}) {  // (caught before: byte count)
    INFO(from << " -> " << to);
    std::string bad = good;
    const auto at = bad.find(from);
    REQUIRE(at != std::string::npos);
    bad.replace(at, from.size(), to);
    CHECK_THROWS_AS(parse_safetensors(bad.data(), bad.size(), "f"), IOError);
  }
  std::string bad = good;
  bad.replace(bad.find("\"50\""), 4, "\"51\"");
  CHECK_THROWS_WITH(parse_safetensors(bad.data(), bad.size(), "f"),
                    Catch::Contains("f: the header (tensor names, dtypes, shapes, offsets or metadata) does not "
                                    "match its checksum"));
}

TEST_CASE("safetensors: a file without checksums still loads, unverified", "[safetensors][checksum]") {
  TempDir dir;
  const std::string path = dir.file("old.safetensors");
  const std::map<std::string, Tensor> tensors{{"a", Tensor::from_vector<float>({1.f, 2.f}, {2})}};
  {
    ChecksumEnv off("off");
    write_safetensors(path, tensors, {{"k", "v"}});
  }
  CHECK(slurp(path).find(kSafetensorsChecksumKey) == std::string::npos);
  SafetensorsFile f = read_safetensors(path);
  check_same(tensors, f.tensors);
  CHECK(f.metadata == std::map<std::string, std::string>{{"k", "v"}});
  CHECK_FALSE(f.verified);
  CHECK(read_safetensors(dir.file("old.safetensors")).tensors.size() == 1);
  SafetensorsReader r(path);
  CHECK_FALSE(r.verified());
  CHECK(r.read("a").equal(tensors.at("a")));
}

TEST_CASE("safetensors: DOPT_CHECKSUMS=off skips verification, bad values and the reserved key are errors",
          "[safetensors][checksum]") {
  std::string bytes = serialize_safetensors({{"a", Tensor::from_vector<float>({1.f, 2.f}, {2})}});
  bytes[bytes.size() - 1] = static_cast<char>(bytes[bytes.size() - 1] ^ 1);
  CHECK_THROWS_AS(parse(bytes), IOError);
  {
    ChecksumEnv off("off");
    CHECK_FALSE(parse(bytes).verified);
  }
  {
    ChecksumEnv bad("maybe");
    CHECK_THROWS_WITH(parse(bytes), Catch::Contains("DOPT_CHECKSUMS=\"maybe\" is not one of on,off,1,0"));
  }
  CHECK_THROWS_AS(serialize_safetensors({}, {{kSafetensorsChecksumKey, "x"}}), ValueError);
}

TEST_CASE("state dict round trip through a file", "[safetensors][state_dict]") {
  StateDict sd;
  sd.state[0]["step"] = Tensor::scalar(3.0, DType::float32);
  sd.state[0]["exp_avg"] = Tensor::from_vector<float>({0.1f, -0.2f}, {2});
  sd.state[2]["step"] = Tensor::scalar(5.0, DType::int64);
  sd.state[2]["momentum_buffer"] = Tensor::from_vector<double>({1.0, 2.0, 3.0, 4.0}, {2, 2});
  sd.state[10]["a.b"] = Tensor::scalar(1.0, DType::float64);  // keys may contain dots
  StateDict::Group g0;
  g0.hyperparams = {{"lr", 0.001}, {"betas", std::vector<double>{0.9, 0.999}}, {"amsgrad", false},
                    {"name", std::string("encoder")}};
  g0.params = {0, 1};
  StateDict::Group g1;
  g1.hyperparams = {{"lr", 0.1}, {"weight_decay", 1e-2}};
  g1.params = {10, 2};
  StateDict::Group g2;  // an empty group
  g2.hyperparams = {{"lr", 0.5}};
  sd.param_groups = {g0, g1, g2};
  sd.metadata = {{"zero_partition", "0,1,1"}, {"rank", "3"}};

  TempDir dir;
  const std::string path = dir.file("state.safetensors");
  save_state_dict(sd, path);
  StateDict back = load_state_dict(path);

  REQUIRE(back.state.size() == 3);
  for (const auto& [idx, st] : sd.state) {
    INFO("param " << idx);
    REQUIRE(back.state.count(idx));
    check_same(st, back.state.at(idx));
  }
  REQUIRE(back.param_groups.size() == 3);
  for (std::size_t k = 0; k < 3; ++k) {
    CHECK(back.param_groups[k].params == sd.param_groups[k].params);
    CHECK(back.param_groups[k].hyperparams == sd.param_groups[k].hyperparams);
  }
  CHECK(back.metadata == sd.metadata);

  SafetensorsFile raw = read_safetensors(path);
  CHECK(raw.metadata.at("dopt.format") == "dopt-state/1");
  CHECK(raw.tensors.count("state.2.momentum_buffer") == 1);
  CHECK(raw.tensors.count("state.10.a.b") == 1);
}

TEST_CASE("state dict files are validated", "[safetensors][state_dict]") {
  TempDir dir;
  const std::string path = dir.file("s.safetensors");
  auto groups = [](const std::string& json) {
    return std::map<std::string, std::string>{{"dopt.format", "dopt-state/1"}, {"dopt.param_groups", json}};
  };
  const Tensor one = Tensor::scalar(1.0);
  struct Case {
    const char* what;
    std::map<std::string, Tensor> tensors;
    std::map<std::string, std::string> meta;
  };
  const std::vector<Case> cases = {
      {"no format", {}, {{"dopt.param_groups", "[]"}}},
      {"wrong format", {}, {{"dopt.format", "dopt-state/2"}, {"dopt.param_groups", "[]"}}},
      {"no param groups", {}, {{"dopt.format", "dopt-state/1"}}},
      {"groups not JSON", {}, groups("[{")},
      {"groups not an array", {}, groups("{}")},
      {"group not an object", {}, groups("[1]")},
      {"group without params", {}, groups(R"([{"lr":1.0}])")},
      {"params not an array", {}, groups(R"([{"params":0}])")},
      {"negative index", {}, groups(R"([{"params":[-1]}])")},
      {"float index", {}, groups(R"([{"params":[0.5]}])")},
      {"index listed twice", {}, groups(R"([{"params":[0]},{"params":[0]}])")},
      {"bad hyperparameter", {}, groups(R"([{"params":[0],"x":null}])")},
      {"tensor with a foreign name", {{"foo", one}}, groups(R"([{"params":[0]}])")},
      {"tensor without key", {{"state.0.", one}}, groups(R"([{"params":[0]}])")},
      {"tensor with a signed index", {{"state.-1.step", one}}, groups(R"([{"params":[0]}])")},
      {"state for an unlisted index", {{"state.4.step", one}}, groups(R"([{"params":[0]}])")},
  };
  for (const auto& c : cases) {
    INFO("case: " << c.what);
    write_safetensors(path, c.tensors, c.meta);
    try {
      load_state_dict(path);
      FAIL("accepted");
    } catch (const StateDictError& e) {
      CHECK(std::string(e.what()).find(path) != std::string::npos);
    }
  }
  // a malformed file is an IOError
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "garbage";
  }
  CHECK_THROWS_AS(load_state_dict(path), IOError);
  // what cannot be saved
  StateDict sd;
  sd.metadata["dopt.format"] = "x";
  CHECK_THROWS_AS(save_state_dict(sd, path), StateDictError);
  StateDict sd2;
  sd2.param_groups.push_back({{{"params", 1.0}}, {}});
  CHECK_THROWS_AS(save_state_dict(sd2, path), StateDictError);
  StateDict sd3;
  sd3.state[0]["step"] = Tensor();
  CHECK_THROWS_AS(save_state_dict(sd3, path), StateDictError);
}

TEST_CASE("load_state_dict notes a file without checksums once, and not one whose checks are only switched off",
          "[safetensors][checksum][state_dict]") {
  TempDir dir;
  StateDict sd;
  sd.state[0]["step"] = Tensor::scalar(3.0, DType::float32);
  sd.param_groups.push_back({{{"lr", 0.1}}, {0}});
  const std::string old = dir.file("old.safetensors"), fresh = dir.file("new.safetensors");
  {
    ChecksumEnv off("off");
    save_state_dict(sd, old);
  }
  save_state_dict(sd, fresh);
  CaptureNotices notes;
  (void)load_state_dict(old);
  (void)load_state_dict(old);
  REQUIRE(notes.notes.size() == 1);
  CHECK(notes.notes[0] == old + " has no checksums (written by an older dopt or another program): it is loaded "
                                "without verifying its bytes");
  {
    ChecksumEnv off("off");
    (void)load_state_dict(fresh);
    CHECK(read_safetensors(fresh).has_checksums);
    CHECK_FALSE(read_safetensors(fresh).verified);
  }
  (void)load_state_dict(fresh);
  CHECK(notes.notes.size() == 1);
}

namespace {
/// A safetensors file whose header lists n empty tensors (shape [0]): the
/// smallest header per tensor, so a hostile file packs the most tensors.
std::string many_tensors(int n) {
  std::string h = "{";
  for (int i = 0; i < n; ++i)
    h += (i ? "," : "") + std::string("\"t") + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
  h += "}";
  h.resize((h.size() + 7) / 8 * 8, ' ');
  return u64le(h.size()) + h;
}
/// CPU seconds of this thread for parsing `file` (other processes on the
/// machine, such as parallel tests, do not count).
double parse_seconds(const std::string& file) {
  auto cpu = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  };
  const double t0 = cpu();
  const SafetensorsFile f = parse_safetensors(file.data(), file.size(), "many.safetensors");
  const double s = cpu() - t0;
  REQUIRE(f.tensors.size() > 0);
  return s;
}
}  // namespace

TEST_CASE("safetensors: parsing a header takes time linear in its size (20k and 200k tensors, 1-18 MB)",
          "[safetensors][hostile]") {
  // nlohmann's callback parser took 0.6 s for 10k tensors, 25 s for 40k and
  // over 120 s for 200k (issue 41): a small hostile file stalled a loader.
  const std::string small = many_tensors(20000), big = many_tensors(200000);
  INFO("header of 200k tensors: " << big.size() << " bytes");
  CHECK(big.size() < kSafetensorsMaxHeader);
  const double t_small = parse_seconds(small), t_big = parse_seconds(big);
  INFO("20k tensors: " << t_small << " s, 200k tensors: " << t_big << " s");
  // Ten times the tensors: about ten times the time (quadratic would be 100).
  // Bounds relative to the small parse, not in seconds: a loaded machine
  // slows both (this one took 0.6 s for 200k, and 1.05 s with checksums in
  // a CI run where a 1 s bound failed).
  CHECK(t_big < 30 * t_small + 0.05);
  // The same with dopt's checksums in the header (verified: a second JSON
  // document of 200k digests, and the header's digest over all of it).
  std::map<std::string, Tensor> empty;
  for (int i = 0; i < 200000; ++i) empty.emplace("t" + std::to_string(i), Tensor::zeros({0}, DType::float32));
  const std::string summed = serialize_safetensors(empty);
  const double t_summed = parse_seconds(summed);
  INFO("200k tensors with checksums: " << t_summed << " s, " << summed.size() << " bytes");
  CHECK(parse_safetensors(summed.data(), summed.size(), "summed").verified);
  // 15 times the small header's bytes: linear is about 20 times its time
  // (the digests are verified too), quadratic over 200.
  CHECK(t_summed < 60 * t_small + 0.1);
  // A duplicate key is still found.
  std::string dup = many_tensors(3);
  dup.replace(dup.find("\"t2\""), 4, "\"t0\"");
  CHECK_THROWS_WITH(parse_safetensors(dup.data(), dup.size(), "dup.safetensors"),
                    Catch::Contains("duplicate key 't0' in header"));
}

TEST_CASE("safetensors: a hostile header is refused before it is held in memory (a 98 MB shape, 70,000 metadata "
          "entries, a field that is not a tensor's)",
          "[safetensors][hostile]") {
  // A 98 MB header whose one tensor has a shape of 49 million ones: held as
  // JSON it took 24 times its size (2.4 GB) before it was refused. Parsed in
  // a child process that reports how much its peak memory grew.
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string header = R"({"a":{"dtype":"F32","shape":[)";
    const std::size_t ones = 49'000'000;
    header.reserve(header.size() + 2 * ones + 64);
    for (std::size_t k = 0; k < ones; ++k) header += k ? ",1" : "1";
    header += R"(],"data_offsets":[0,4]}})";
    const std::string file = make_file(header, std::string(4, '\0'));
    header.clear();
    header.shrink_to_fit();
    rusage before{}, after{};
    ::getrusage(RUSAGE_SELF, &before);
    std::string why;
    try {
      (void)parse_safetensors(file.data(), file.size(), "hostile.safetensors");
    } catch (const IOError& e) {
      why = e.what();
    }
    ::getrusage(RUSAGE_SELF, &after);
    const std::string report = std::to_string(after.ru_maxrss - before.ru_maxrss) + " " + why;
    (void)!::write(fds[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) report.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  INFO(report);
  REQUIRE(WIFEXITED(status));
  const long grew_kib = std::stol(report);
  CHECK(grew_kib < 64 * 1024);  // under 64 MiB more (it was over 2 GiB)
  CHECK_THAT(report, Catch::Contains("hostile.safetensors: tensor 'a' has more than 64 dimensions"));

  // 70,000 metadata entries: more than a header may hold.
  std::string meta = R"({"__metadata__":{)";
  for (int k = 0; k < 70000; ++k) meta += (k ? ",\"" : "\"") + std::to_string(k) + "\":\"\"";
  meta += "}}";
  const std::string m = make_file(meta);
  CHECK_THROWS_WITH(parse_safetensors(m.data(), m.size(), "m"),
                    Catch::Contains("__metadata__ has more than 65536 entries"));
  // A field no tensor has is refused at its name, before its value is read.
  const std::string x = make_file(R"({"a":{"dtype":"F32","extra":[)" + std::string(1000, '[') + "]]}}");
  CHECK_THROWS_WITH(parse_safetensors(x.data(), x.size(), "x"), Catch::Contains("tensor 'a' has an unknown field 'extra'"));
}
