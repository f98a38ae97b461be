#include "dopt/runtime/safetensors.hpp"
#include "dopt/runtime/settings.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/read_faults.hpp"

static_assert(std::endian::native == std::endian::little,
              "dopt's safetensors I/O assumes a little-endian host");

namespace dopt {
namespace {

using json = nlohmann::json;

constexpr const char* kOp = "safetensors";

[[noreturn]] void fail(const std::string& what, const std::string& problem) {
  throw IOError(kOp, what + ": " + problem);
}

std::string errno_text() { return std::strerror(errno); }

// --- checksums (see the header) ------------------------------------------------

constexpr const char* kChecksumAlgorithm = "xxh3-64";

std::string hex64(std::uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int k = 15; k >= 0; --k, v >>= 4) s[static_cast<std::size_t>(k)] = digits[v & 0xf];
  return s;
}

std::uint64_t digest(const void* p, std::size_t n) { return XXH3_64bits(p, n); }

bool checksums_enabled() {
  const auto v = settings::text("DOPT_CHECKSUMS");
  return !v || *v == "on" || *v == "1";
}

/// The digest of a header without its checksum entry: the compact JSON dump
/// of the header object (keys in sorted order, as nlohmann::json keeps them).
std::uint64_t header_digest(const json& header_without_checksums) {
  const std::string text = header_without_checksums.dump();
  return digest(text.data(), text.size());
}

/// What the header's "dopt.checksum" entry says.
struct Checksums {
  std::uint64_t header = 0;
  std::map<std::string, std::uint64_t> tensors;
};

std::uint64_t read_u64_le(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

void write_u64_le(unsigned char* p, std::uint64_t v) {
  for (int k = 0; k < 8; ++k) p[k] = static_cast<unsigned char>(v >> (8 * k));
}

std::optional<DType> safetensors_dtype(const std::string& name) {
  for (DType dt : {DType::float32, DType::float64, DType::float16, DType::bfloat16, DType::int8,
                   DType::uint8, DType::int32, DType::int64, DType::bool_}) {
    if (name == safetensors_name(dt)) return dt;
  }
  return std::nullopt;
}

/// Checks the 8-byte length prefix against the total size; returns N.
std::uint64_t check_header_length(std::uint64_t n, std::uint64_t total, const std::string& what) {
  if (n > kSafetensorsMaxHeader)
    fail(what, "header length " + std::to_string(n) + " exceeds the limit of " +
                   std::to_string(kSafetensorsMaxHeader) + " bytes");
  if (n > total - 8)
    fail(what, "header length " + std::to_string(n) + " exceeds the " + std::to_string(total - 8) +
                   " bytes that follow the length prefix (truncated file?)");
  if (n == 0) fail(what, "header is empty");
  return n;
}

std::uint64_t read_offset(const json& v, const std::string& what, const std::string& name) {
  if (!v.is_number_integer())
    fail(what, "tensor '" + name + "': data_offsets must hold two non-negative integers");
  if (!v.is_number_unsigned())
    fail(what, "tensor '" + name + "': negative data offset " + v.dump());
  return v.get<std::uint64_t>();
}

struct ParsedHeader {
  std::vector<SafetensorsEntry> entries;  // sorted by name
  std::map<std::string, std::string> metadata;  // without kSafetensorsChecksumKey
  std::optional<Checksums> checksums;           // absent: an older or foreign file, or not verified
  bool has_checksums = false;                   // the file carries them
};

std::uint64_t parse_hex64(const std::string& text, const std::string& what, const std::string& field) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail(what, std::string(kSafetensorsChecksumKey) + ": " + field + " is not 16 lower-case hex digits");
  return std::stoull(text, nullptr, 16);
}

/// Reads the checksum entry {"header": digest, "tensors": {name: digest}}
/// straight into a Checksums, without a DOM of its own (a header of 200k
/// tensors holds 200k digests).
class ChecksumSax {
 public:
  ChecksumSax(Checksums& out, const std::string& what) : out_(out), what_(what) {}
  bool null() { return bad(); }
  bool boolean(bool) { return bad(); }
  bool number_integer(json::number_integer_t) { return bad(); }
  bool number_unsigned(json::number_unsigned_t) { return bad(); }
  bool number_float(json::number_float_t, const std::string&) { return bad(); }
  bool binary(json::binary_t&) { return bad(); }
  bool string(std::string& v) {
    if (depth_ == 1 && key_ == "header" && !have_header_) {
      out_.header = parse_hex64(v, what_, "header");
      have_header_ = true;
    } else if (depth_ == 2) {
      const std::size_t before = out_.tensors.size();
      // In key order (as dopt writes them): each goes to the end in constant time.
      out_.tensors.emplace_hint(out_.tensors.end(), key_, parse_hex64(v, what_, "tensor '" + key_ + "'"));
      if (out_.tensors.size() == before) fail(what_, std::string(kSafetensorsChecksumKey) + ": tensor '" + key_ + "' twice");
    } else {
      return bad();
    }
    return true;
  }
  bool start_object(std::size_t) {
    if (depth_ == 0 || (depth_ == 1 && key_ == "tensors" && !have_tensors_)) {
      if (depth_ == 1) have_tensors_ = true;
      ++depth_;
      return true;
    }
    return bad();
  }
  bool key(std::string& k) {
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) { return bad(); }
  bool end_array() { return bad(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    fail(what_, std::string(kSafetensorsChecksumKey) + " is not valid JSON: " + e.what());
  }
  bool complete() const { return have_header_ && have_tensors_; }

 private:
  bool bad() {
    if (depth_ == 2) fail(what_, std::string(kSafetensorsChecksumKey) + ": tensor '" + key_ + "'");
    fail(what_, std::string(kSafetensorsChecksumKey) + " must be {\"header\": digest, \"tensors\": {name: digest}}");
  }
  Checksums& out_;
  const std::string& what_;
  int depth_ = 0;
  std::string key_;
  bool have_header_ = false, have_tensors_ = false;
};

/// Parses the checksum entry's text.
Checksums parse_checksums(const std::string& text, const std::string& what) {
  Checksums out;
  ChecksumSax sax(out, what);
  try {
    json::sax_parse(text, &sax);
  } catch (const json::exception& e) {
    fail(what, std::string(kSafetensorsChecksumKey) + " is not valid JSON: " + e.what());
  }
  if (!sax.complete())
    fail(what, std::string(kSafetensorsChecksumKey) + " must be {\"header\": digest, \"tensors\": {name: digest}}");
  return out;
}

/// Reads the header in one pass, in time linear in its size, handing each
/// value of the root object to `done` as soon as it is complete (nlohmann's
/// callback parser scans the parent object after every inner object ends:
/// quadratic in the number of tensors, minutes for a 15 MB header of 200k
/// tensors). Only one root value is held as JSON at a time, and the shape
/// of a safetensors header is enforced while reading (the root an object;
/// a tensor an object of dtype, shape and data_offsets with at most
/// kMaxDims dimensions; __metadata__ an object of at most kMaxMetadata
/// strings), so a hostile header is refused before it is held in memory.
/// Duplicate keys are caught here (the last one would win after parsing).
class HeaderSax {
 public:
  static constexpr std::size_t kMaxDims = 64;
  static constexpr std::size_t kMaxMetadata = 65536;
  using Done = std::function<void(const std::string& key, json&& value)>;
  HeaderSax(const std::string& what, Done done) : what_(what), done_(std::move(done)) {}
  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(json::number_integer_t v) { return put(v); }
  bool number_unsigned(json::number_unsigned_t v) { return put(v); }
  bool number_float(json::number_float_t v, const std::string&) { return put(v); }
  bool string(std::string& v) { return put(std::move(v)); }
  bool binary(json::binary_t& v) { return put(json::binary(std::move(v))); }
  bool start_object(std::size_t) {
    if (depth_ == 0) {  // the root
      depth_ = 1;
      return true;
    }
    if (depth_ >= 2) fail(what_, nested_problem("an object"));
    value_ = json::object();
    depth_ = 2;
    return true;
  }
  bool key(std::string& k) {
    if (depth_ == 1) {
      if (!seen_.insert(k).second) fail(what_, "duplicate key '" + k + "' in header");
      root_key_ = std::move(k);
      return true;
    }
    // depth 2: a field of a tensor, or an entry of __metadata__
    auto& obj = value_.get_ref<json::object_t&>();
    if (obj.count(k)) fail(what_, "duplicate key '" + k + "' in header");
    if (metadata()) {
      if (obj.size() >= kMaxMetadata)
        fail(what_, "__metadata__ has more than " + std::to_string(kMaxMetadata) + " entries");
    } else if (k != "dtype" && k != "shape" && k != "data_offsets") {
      fail(what_, "tensor '" + root_key_ + "' has an unknown field '" + k + "'");
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    if (depth_ == 2) {
      depth_ = 1;
      done_(root_key_, std::move(value_));
    } else {
      depth_ = 0;
      complete_ = true;
    }
    return true;
  }
  bool start_array(std::size_t) {
    if (depth_ == 0) fail(what_, "header must be a JSON object, got array");
    if (depth_ == 1 && metadata()) fail(what_, "__metadata__ must be an object of strings");
    if (depth_ == 1) fail(what_, "tensor '" + root_key_ + "' must be described by an object");
    if (depth_ >= 3) fail(what_, nested_problem("an array"));
    if (metadata()) fail(what_, "__metadata__ entry '" + key_ + "' is not a string (array)");
    value_[key_] = json::array();
    depth_ = 3;
    return true;
  }
  bool end_array() {
    depth_ = 2;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    fail(what_, std::string("header is not valid JSON: ") + e.what());
  }
  /// The whole root object was read.
  bool complete() const { return complete_; }

 private:
  bool metadata() const { return root_key_ == "__metadata__"; }
  std::string nested_problem(const char* kind) const {
    if (metadata()) return "__metadata__ entry '" + key_ + "' is not a string (" + kind + ")";
    return "tensor '" + root_key_ + "': field '" + key_ + "' holds " + kind + " where a " +
           (depth_ >= 3 ? "number" : "value") + " belongs";
  }
  bool put(json v) {
    switch (depth_) {
      case 0: fail(what_, std::string("header must be a JSON object, got ") + v.type_name());
      case 1:
        if (metadata()) fail(what_, "__metadata__ must be an object of strings");
        fail(what_, "tensor '" + root_key_ + "' must be described by an object");
      case 2:
        if (metadata() && !v.is_string())
          fail(what_, "__metadata__ entry '" + key_ + "' is not a string (" + v.type_name() + ")");
        value_[key_] = std::move(v);
        return true;
      default: {
        json& arr = value_[key_];
        const std::size_t limit = key_ == "shape" ? kMaxDims : 2;
        if (arr.size() >= limit) {
          if (key_ == "shape")
            fail(what_, "tensor '" + root_key_ + "' has more than " + std::to_string(kMaxDims) + " dimensions");
          fail(what_, "tensor '" + root_key_ + "': data_offsets must hold two non-negative integers");
        }
        arr.push_back(std::move(v));
        return true;
      }
    }
  }
  const std::string& what_;
  Done done_;
  int depth_ = 0;            // 0 outside, 1 in the root, 2 in a root value, 3 in an array of it
  std::string root_key_, key_;
  json value_;               // the root value being read
  std::set<std::string> seen_;
  bool complete_ = false;
};

/// Checks one tensor's description (an object of dtype, shape and
/// data_offsets); data_size is the length of the data section.
SafetensorsEntry tensor_entry(const std::string& name, const json& v, std::uint64_t data_size,
                              const std::string& what) {
  SafetensorsEntry e;
  e.name = name;
  // dtype
  auto dt = v.find("dtype");
  if (dt == v.end()) fail(what, "tensor '" + name + "' has no dtype");
  if (!dt->is_string()) fail(what, "tensor '" + name + "': dtype must be a string");
  auto parsed_dt = safetensors_dtype(dt->get<std::string>());
  if (!parsed_dt) fail(what, "tensor '" + name + "' has an unknown dtype '" + dt->get<std::string>() + "'");
  e.dtype = *parsed_dt;
  // shape
  auto sh = v.find("shape");
  if (sh == v.end()) fail(what, "tensor '" + name + "' has no shape");
  if (!sh->is_array()) fail(what, "tensor '" + name + "': shape must be an array of integers");
  bool has_zero = false;
  std::uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : *sh) {
    if (!d.is_number_integer()) fail(what, "tensor '" + name + "': shape must be an array of integers");
    if (!d.is_number_unsigned()) fail(what, "tensor '" + name + "' has a negative dimension " + d.dump());
    const std::uint64_t dim = d.get<std::uint64_t>();
    if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail(what, "tensor '" + name + "' has a dimension too large: " + d.dump());
    if (dim == 0) has_zero = true;
    if (!overflow && __builtin_mul_overflow(numel, dim, &numel)) overflow = true;
    e.shape.push_back(static_cast<std::int64_t>(dim));
  }
  std::uint64_t nbytes = 0;
  if (has_zero) {
    numel = 0;
  } else if (overflow || __builtin_mul_overflow(numel, std::uint64_t(itemsize(e.dtype)), &nbytes) ||
             numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    fail(what, "tensor '" + name + "': shape " + sh->dump() + " overflows the element count");
  }
  // data_offsets
  auto off = v.find("data_offsets");
  if (off == v.end()) fail(what, "tensor '" + name + "' has no data_offsets");
  if (!off->is_array() || off->size() != 2)
    fail(what, "tensor '" + name + "': data_offsets must hold two non-negative integers");
  e.begin = read_offset((*off)[0], what, name);
  e.end = read_offset((*off)[1], what, name);
  if (e.end < e.begin)
    fail(what, "tensor '" + name + "': data_offsets end " + std::to_string(e.end) + " < begin " +
                   std::to_string(e.begin));
  if (e.end > data_size)
    fail(what, "tensor '" + name + "': data_offsets [" + std::to_string(e.begin) + ", " +
                   std::to_string(e.end) + "] lie outside the " + std::to_string(data_size) +
                   "-byte data section (truncated file?)");
  if (e.nbytes() != nbytes)
    fail(what, "tensor '" + name + "': " + std::to_string(e.nbytes()) + " data bytes for " +
                   std::to_string(numel) + " elements of " + std::string(dtype_name(e.dtype)) +
                   " (expected " + std::to_string(nbytes) + ")");
  return e;
}

/// Parses and validates a header of n bytes; data_size is the length of the
/// data section that follows it.
ParsedHeader parse_header(const char* p, std::size_t n, std::uint64_t data_size, const std::string& what) {
  ParsedHeader out;
  // The header as the writer digested it: each root value's compact JSON by
  // key (json objects dump their keys in this order).
  std::map<std::string, std::string> dumped;
  json meta = json::object();
  HeaderSax sax(what, [&](const std::string& key, json&& v) {
    if (key == "__metadata__") {
      meta = std::move(v);
      return;
    }
    dumped.emplace(key, v.dump());
    out.entries.push_back(tensor_entry(key, v, data_size, what));
  });
  try {
    json::sax_parse(p, p + n, &sax, nlohmann::detail::input_format_t::json, /*strict=*/true,
                    /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    fail(what, std::string("header is not valid JSON: ") + e.what());
  }
  if (!sax.complete()) fail(what, "header must be a JSON object");
  for (auto m = meta.begin(); m != meta.end(); ++m) out.metadata.emplace(m.key(), m.value().get<std::string>());
  std::sort(out.entries.begin(), out.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.name < b.name; });
  // Overlaps: sort the non-empty tensors by begin offset.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : out.entries)
    if (e.nbytes() > 0) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  for (std::size_t k = 1; k < by_offset.size(); ++k) {
    if (by_offset[k]->begin < by_offset[k - 1]->end)
      fail(what, "tensors '" + by_offset[k - 1]->name + "' and '" + by_offset[k]->name + "' overlap");
  }
  // Two entries, so that no single damaged key name can pass the file off
  // as one without checksums: the algorithm (covered by the header digest)
  // and the digests.
  auto algo = out.metadata.find(kSafetensorsChecksumAlgorithmKey);
  auto c = out.metadata.find(kSafetensorsChecksumKey);
  const bool has_algo = algo != out.metadata.end(), has_sums = c != out.metadata.end();
  std::string algorithm = has_algo ? algo->second : std::string();
  std::string text = has_sums ? c->second : std::string();
  if (has_algo) out.metadata.erase(algo);
  if (has_sums) out.metadata.erase(c);
  out.has_checksums = has_algo || has_sums;
  if ((has_algo || has_sums) && checksums_enabled()) {
    if (!has_algo || !has_sums)
      fail(what, std::string("the header has '") + (has_algo ? kSafetensorsChecksumAlgorithmKey : kSafetensorsChecksumKey) +
                     "' but not '" + (has_algo ? kSafetensorsChecksumKey : kSafetensorsChecksumAlgorithmKey) +
                     "': the header is damaged");
    if (algorithm != kChecksumAlgorithm)
      fail(what, "unknown checksum algorithm '" + algorithm + "' (this dopt knows " + kChecksumAlgorithm +
                     "; a damaged header?)");
    {
      out.checksums = parse_checksums(text, what);
      // What the writer digested: the header without the checksum entry
      // (and without __metadata__ when nothing else is in it).
      meta.erase(kSafetensorsChecksumKey);
      if (!meta.empty()) dumped.emplace("__metadata__", meta.dump());
      std::string whole = "{";
      for (const auto& [key, text_of] : dumped) {
        if (whole.size() > 1) whole += ',';
        whole += json(key).dump();
        whole += ':';
        whole += text_of;
      }
      whole += '}';
      if (digest(whole.data(), whole.size()) != out.checksums->header)
        fail(what, "the header (tensor names, dtypes, shapes, offsets or metadata) does not match its checksum: "
                   "the file is corrupt");
      // Both in name order: one pass.
      auto sum = out.checksums->tensors.begin();
      for (const auto& e : out.entries) {
        if (sum == out.checksums->tensors.end() || sum->first != e.name)
          fail(what, "tensor '" + e.name + "' has no checksum");
        ++sum;
      }
      if (out.checksums->tensors.size() != out.entries.size())
        fail(what, std::string(kSafetensorsChecksumKey) + " lists a tensor the file does not hold");
    }
  }
  return out;
}

/// Compares the digest of tensor e's bytes with its checksum.
void check_digest(std::uint64_t want, std::uint64_t got, const SafetensorsEntry& e, const std::string& what) {
  if (got != want)
    fail(what, "tensor '" + e.name + "' does not match its checksum (" + std::to_string(e.nbytes()) +
                   " bytes at data offset " + std::to_string(e.begin) + "; stored " + hex64(want) + ", read " +
                   hex64(got) + "): the file is corrupt");
}

/// Compares the bytes of tensor e with its checksum.
void verify_bytes(std::uint64_t want, const SafetensorsEntry& e, const void* bytes, const std::string& what) {
  check_digest(want, digest(bytes, e.nbytes()), e, what);
}

/// Bytes read (and digested) at a time by SafetensorsReader::read_into: a
/// chunk is digested right after it is read, while it is still in the cache,
/// instead of a second pass over the whole tensor from memory.
constexpr std::size_t kReadChunk = std::size_t(1) << 20;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

/// Maps the whole pages of [p, p + n) writable in one call: a destination
/// freshly allocated (a load's new state) would otherwise take a page fault
/// per 4 KiB page inside pread (tensors under 2 MiB, and the tails of larger
/// ones, are not on huge pages). Advice only: an older kernel's EINVAL is
/// ignored, and memory already mapped is only walked.
void prefault(void* p, std::size_t n) {
  constexpr std::uintptr_t kPage = 4096;
  if (n < 16 * kPage) return;
  const auto lo = (reinterpret_cast<std::uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  const auto hi = (reinterpret_cast<std::uintptr_t>(p) + n) & ~(kPage - 1);
  if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
}

struct Xxh3StateFree {
  void operator()(XXH3_state_t* s) const noexcept { XXH3_freeState(s); }
};



void check_bools(const Tensor& t, const std::string& what, const std::string& name) {
  if (t.dtype() != DType::bool_) return;
  const auto* b = static_cast<const unsigned char*>(t.data_ptr());
  for (std::int64_t k = 0; k < t.numel(); ++k)
    if (b[k] > 1) fail(what, "tensor '" + name + "' holds a BOOL byte that is neither 0 nor 1");
}

Tensor tensor_from_bytes(const SafetensorsEntry& e, const char* bytes) {
  Tensor t = Tensor::empty(e.shape, e.dtype);
  if (e.nbytes() > 0) std::memcpy(t.data_ptr(), bytes, e.nbytes());
  return t;
}

// --- writing -----------------------------------------------------------------

using Sink = std::function<void(const void*, std::size_t)>;

void check_writable(const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& metadata) {
  for (const auto& [name, t] : tensors) {
    if (name.empty()) throw ValueError(kOp, "a tensor name must not be empty");
    if (name == "__metadata__") throw ValueError(kOp, "'__metadata__' is reserved and cannot name a tensor");
    if (!t.defined()) throw ValueError(kOp, "tensor '" + name + "' is undefined");
  }
  for (const char* key : {kSafetensorsChecksumKey, kSafetensorsChecksumAlgorithmKey})
    if (metadata.count(key))
      throw ValueError(kOp, std::string("the metadata key '") + key + "' is reserved (the writer fills it in)");
}

/// The tensors as host tensors (device tensors are copied once, so that the
/// checksum and the written bytes come from the same copy).
std::map<std::string, Tensor> on_host(const std::map<std::string, Tensor>& tensors) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : tensors) out.emplace(name, t.device().is_cpu() ? t : t.to(Device::cpu()));
  return out;
}

std::string make_header(const std::map<std::string, Tensor>& tensors,
                        const std::map<std::string, std::string>& metadata, const std::string& what) {
  json j = json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const std::uint64_t nb = t.nbytes();
    j[name] = json{{"dtype", std::string(safetensors_name(t.dtype()))},
                   {"shape", t.shape()},
                   {"data_offsets", {offset, offset + nb}}};
    offset += nb;
  }
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::string header;
  try {
    if (checksums_enabled()) {
      json sums = json::object();
      for (const auto& [name, t] : tensors) sums[name] = hex64(digest(t.data_ptr(), t.nbytes()));
      j["__metadata__"][kSafetensorsChecksumAlgorithmKey] = kChecksumAlgorithm;
      const json c = {{"header", hex64(header_digest(j))}, {"tensors", sums}};
      j["__metadata__"][kSafetensorsChecksumKey] = c.dump();
    }
    header = j.dump();
  } catch (const json::exception& e) {
    fail(what, std::string("cannot encode the header (names and metadata must be UTF-8): ") + e.what());
  }
  header.resize((header.size() + 7) / 8 * 8, ' ');
  return header;
}

void emit(const std::map<std::string, Tensor>& input, const std::map<std::string, std::string>& metadata,
          const std::string& what, const Sink& sink) {
  check_writable(input, metadata);
  const std::map<std::string, Tensor> tensors = on_host(input);
  const std::string header = make_header(tensors, metadata, what);
  unsigned char len[8];
  write_u64_le(len, header.size());
  sink(len, 8);
  sink(header.data(), header.size());
  for (const auto& [name, t] : tensors)
    if (t.nbytes() > 0) sink(t.data_ptr(), t.nbytes());
}

std::atomic<unsigned> g_tmp_counter{0};

}  // namespace

// --- reading -------------------------------------------------------------------

SafetensorsFile parse_safetensors(const void* data, std::size_t size, const std::string& what) {
  if (size < 8) fail(what, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte length prefix");
  const auto* bytes = static_cast<const unsigned char*>(data);
  const std::uint64_t n = check_header_length(read_u64_le(bytes), size, what);
  const char* header = reinterpret_cast<const char*>(bytes + 8);
  ParsedHeader h = parse_header(header, static_cast<std::size_t>(n), size - 8 - n, what);
  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  out.verified = h.checksums.has_value();
  out.has_checksums = h.has_checksums;
  const char* data_section = header + n;
  // The digests are in name order, as the entries (checked by parse_header).
  auto sum = h.checksums ? h.checksums->tensors.cbegin() : std::map<std::string, std::uint64_t>::const_iterator{};
  for (const auto& e : h.entries) {
    if (h.checksums) verify_bytes((sum++)->second, e, data_section + e.begin, what);
    Tensor t = tensor_from_bytes(e, data_section + e.begin);
    check_bools(t, what, e.name);
    out.tensors.emplace_hint(out.tensors.end(), e.name, std::move(t));
  }
  return out;
}

namespace {
/// The reader whose next tensor is to be damaged (read faults; one per thread).
thread_local const void* t_damage_next = nullptr;
}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path), file_(nullptr, &std::fclose) {
  if (auto hook = detail::g_read_fault_hook.load(std::memory_order_acquire)) [[unlikely]] {
    const int fault = hook(path);
    if (fault == 1) fail(path, "cannot open for reading: injected read failure");
    if (fault == 2) t_damage_next = this;
  }
  file_.reset(std::fopen(path.c_str(), "rb"));
  if (!file_) fail(path, "cannot open for reading: " + errno_text());
  struct stat st {};
  if (::fstat(::fileno(file_.get()), &st) != 0) fail(path, "cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  // Tensors are mostly read front to back: a larger read-ahead (advice only).
  (void)::posix_fadvise(::fileno(file_.get()), 0, 0, POSIX_FADV_SEQUENTIAL);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < 8) fail(path, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte length prefix");
  unsigned char len[8];
  if (std::fread(len, 1, 8, file_.get()) != 8) fail(path, "cannot read the length prefix");
  const std::uint64_t n = check_header_length(read_u64_le(len), size, path);
  std::string header(static_cast<std::size_t>(n), '\0');
  if (std::fread(header.data(), 1, header.size(), file_.get()) != header.size())
    fail(path, "file ends inside the header (truncated file?)");
  ParsedHeader h = parse_header(header.data(), header.size(), size - 8 - n, path);
  entries_ = std::move(h.entries);
  metadata_ = std::move(h.metadata);
  has_checksums_ = h.has_checksums;
  if (h.checksums) {
    checksummed_ = true;
    checksums_ = std::move(h.checksums->tensors);
  }
  data_offset_ = 8 + n;
}

SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

bool SafetensorsReader::contains(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const SafetensorsEntry& e, const std::string& n) { return e.name < n; });
  return it != entries_.end() && it->name == name;
}

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const SafetensorsEntry& e, const std::string& n) { return e.name < n; });
  if (it == entries_.end() || it->name != name)
    throw KeyError(kOp, path_ + ": no tensor named '" + name + "'");
  return *it;
}

Tensor SafetensorsReader::read(const std::string& name) {
  const SafetensorsEntry& e = entry(name);
  Tensor t = Tensor::empty(e.shape, e.dtype);
  read_into(name, t);
  return t;
}

void SafetensorsReader::read_into(const std::string& name, const Tensor& t) {
  const SafetensorsEntry& e = entry(name);
  const std::string op = "SafetensorsReader::read_into";
  check_defined(t, op.c_str(), "destination");
  if (!t.device().is_cpu())
    throw DeviceError(op, "destination for '" + name + "' is on " + t.device().str() + ", expected cpu");
  if (t.dtype() != e.dtype)
    throw DTypeError(op, "destination for '" + name + "' is " + std::string(dtype_name(t.dtype())) + ", file holds " +
                             std::string(dtype_name(e.dtype)));
  if (t.nbytes() != e.nbytes())
    throw ShapeError(op, "destination for '" + name + "' has " + std::to_string(t.numel()) +
                             " elements, file holds shape " + shape_str(e.shape));
  if (e.nbytes() == 0) return;
  if (!file_) fail(path_, "reader is closed");
  const std::uint64_t pos = data_offset_ + e.begin;
  if (pos > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max()) ||
      e.nbytes() > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max()) - pos)
    fail(path_, "cannot seek to tensor '" + name + "': offset out of range");
  // pread on the descriptor: straight into dst, no stdio buffer (whose
  // refill after every seek read 4 KiB more per tensor), and no seek.
  const int fd = ::fileno(file_.get());
  std::unique_ptr<XXH3_state_t, Xxh3StateFree> state(checksummed_ ? XXH3_createState() : nullptr);
  if (checksummed_ && (!state || XXH3_64bits_reset(state.get()) != XXH_OK)) throw std::bad_alloc();
  auto* b = static_cast<unsigned char*>(t.data_ptr());
  prefault(b, e.nbytes());
  for (std::uint64_t done = 0; done < e.nbytes();) {
    const std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(kReadChunk, e.nbytes() - done));
    std::size_t got = 0;
    while (got < chunk) {
      const ssize_t r = ::pread(fd, b + done + got, chunk - got, static_cast<off_t>(pos + done + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail(path_, "cannot read tensor '" + name + "': " + errno_text());
      if (r == 0) fail(path_, "file ends inside tensor '" + name + "' (truncated file?)");
      got += static_cast<std::size_t>(r);
    }
    done += chunk;
    if (done == e.nbytes() && t_damage_next == this) [[unlikely]] {
      t_damage_next = nullptr;
      b[e.nbytes() - 1] ^= 0x7f;  // the top byte of the last element (little endian): a large change
    }
    if (state) XXH3_64bits_update(state.get(), b + done - chunk, chunk);
  }
  if (state) check_digest(checksums_.at(name), XXH3_64bits_digest(state.get()), e, path_);
  check_bools(t, path_, name);
}

SafetensorsFile read_safetensors(const std::string& path) {
  SafetensorsReader r(path);
  SafetensorsFile out;
  out.metadata = r.metadata();
  out.verified = r.verified();
  out.has_checksums = r.has_checksums();
  for (const auto& e : r.entries()) out.tensors.emplace(e.name, r.read(e.name));
  return out;
}

// --- writing ---------------------------------------------------------------------

std::string serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::string out;
  emit(tensors, metadata, "serialize_safetensors",
       [&](const void* p, std::size_t n) { out.append(static_cast<const char*>(p), n); });
  return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  check_writable(tensors, metadata);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(g_tmp_counter.fetch_add(1));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(path, "cannot create temporary file '" + tmp + "': " + errno_text());
  try {
    emit(tensors, metadata, path, [&](const void* p, std::size_t n) {
      if (std::fwrite(p, 1, n, f) != n) fail(path, "write failed: " + errno_text());
    });
    if (std::fflush(f) != 0) fail(path, "write failed: " + errno_text());
    if (::fsync(::fileno(f)) != 0) fail(path, "fsync failed: " + errno_text());
    const int rc = std::fclose(f);
    f = nullptr;
    if (rc != 0) fail(path, "close failed: " + errno_text());
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      fail(path, "cannot rename temporary file into place: " + errno_text());
  } catch (...) {
    if (f) std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
}

}  // namespace dopt
