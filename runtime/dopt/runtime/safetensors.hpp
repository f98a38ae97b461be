#pragma once
// safetensors files (https://github.com/huggingface/safetensors):
//   8 bytes   N, the header length, unsigned 64-bit little-endian
//   N bytes   UTF-8 JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]},
//             optional "__metadata__": {string: string}}, padded with spaces
//   data      each tensor's raw little-endian row-major bytes at [begin, end)
//             counted from the start of the data section
//
// Every dopt::DType is supported (F32, F64, F16, BF16, I8, U8, I32, I64, BOOL).
//
// Reading contract: any malformed or hostile input (bad header length, invalid
// JSON or UTF-8, missing or ill-typed fields, unknown dtype, negative or
// overflowing shapes, bad or overlapping offsets, byte counts that do not match
// the shape, non-string metadata, duplicate keys, truncated data, BOOL bytes
// other than 0/1) raises dopt::IOError naming the file and the problem; the
// reader never reads outside the buffer or file. Unused bytes between tensors
// (holes) are tolerated; overlaps are not.
//
// Writing contract: keys are written in sorted order (std::map order), the
// data section in the same order with no holes, the header padded with spaces
// to a multiple of 8 bytes, so equal inputs give byte-identical files. Tensors
// on another device are copied to the host first.
//
// Checksums: the writer adds two metadata entries, "dopt.checksum.algorithm"
// = "xxh3-64" and "dopt.checksum", a JSON object {"header": H, "tensors":
// {name: T}} where T is the XXH3-64 digest of a tensor's data bytes and H the
// digest of the header without the "dopt.checksum" entry (so names, dtypes,
// shapes, offsets and the other metadata are covered too), each as 16
// lower-case hex digits. One entry without the other is a damaged header.
// Every reader
// below verifies them: a header or a tensor whose bytes differ from what was
// written raises dopt::IOError naming the file and the tensor ("tensor
// 'state.3.exp_avg_sq' does not match its checksum ... the file is corrupt").
// The entries are not part of the metadata the readers return, and callers
// may not set them (ValueError). A file without them (an older dopt, another
// program) is read unverified (SafetensorsFile::verified and
// SafetensorsReader::verified() say so, has_checksums says whether it has
// them at all; dopt's checkpoint loaders note a file without them through
// dopt::notice()).
// The environment variable DOPT_CHECKSUMS=off turns both writing and
// verifying off (for measurements, or to rescue the data of a damaged file);
// any value other than on/off/1/0 is a ValueError.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dopt/runtime/tensor.hpp"

namespace dopt {

/// Largest header accepted by the readers (bytes).
inline constexpr std::uint64_t kSafetensorsMaxHeader = 100ull * 1024 * 1024;
/// The metadata entries holding the checksums (see above).
inline constexpr const char* kSafetensorsChecksumKey = "dopt.checksum";
inline constexpr const char* kSafetensorsChecksumAlgorithmKey = "dopt.checksum.algorithm";

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  /// The file carried checksums and every tensor matched them.
  bool verified = false;
  /// The file carries checksums (verified or not: DOPT_CHECKSUMS=off).
  bool has_checksums = false;
};

/// One tensor as described by a header. Offsets are relative to the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::float32;
  Shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t nbytes() const noexcept { return end - begin; }
};

/// Reads a whole file. Throws dopt::IOError (file missing, unreadable or malformed).
SafetensorsFile read_safetensors(const std::string& path);
/// Parses a whole file held in memory; `what` names it in error messages.
SafetensorsFile parse_safetensors(const void* data, std::size_t size, const std::string& what);

/// The file's bytes. Throws dopt::ValueError for an undefined tensor, an empty
/// name or the reserved name "__metadata__", dopt::IOError for metadata that is
/// not valid UTF-8.
std::string serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});
/// Writes the file atomically: a temporary file beside `path` is written,
/// flushed and renamed over `path`, so readers never see a half-written file.
/// Throws dopt::IOError when writing fails (the temporary file is removed).
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Opens a file and reads only its header; tensors are then read one at a time,
/// so memory stays bounded by the largest tensor (for resharding big states).
/// Not thread-safe (one file position).
class SafetensorsReader {
 public:
  /// Throws dopt::IOError when the file cannot be opened or its header is malformed.
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const noexcept { return path_; }
  /// Entries sorted by name.
  const std::vector<SafetensorsEntry>& entries() const noexcept { return entries_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  /// True when the file carries checksums and they are verified (read()
  /// and read_into() check each tensor's bytes; the header was checked by
  /// the constructor).
  bool verified() const noexcept { return checksummed_; }
  /// True when the file carries checksums (also with DOPT_CHECKSUMS=off).
  bool has_checksums() const noexcept { return has_checksums_; }
  bool contains(const std::string& name) const;
  /// Throws dopt::KeyError naming the file when absent.
  const SafetensorsEntry& entry(const std::string& name) const;
  /// Reads one tensor (a new CPU tensor). Throws dopt::KeyError when absent,
  /// dopt::IOError when the file is shorter than its header claims, the data
  /// is invalid or does not match its checksum.
  Tensor read(const std::string& name);
  /// Reads one tensor into dst (CPU, same dtype and element count; the shape
  /// may differ, e.g. a flat view of a shard). Throws dopt::KeyError when
  /// absent, dopt::DTypeError / dopt::ShapeError / dopt::DeviceError for a
  /// dst that does not fit, dopt::IOError as read().
  void read_into(const std::string& name, const Tensor& dst);
  /// Absolute file offset of the data section (8 + header length).
  std::uint64_t data_offset() const noexcept { return data_offset_; }

 private:
  std::string path_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_;
  std::uint64_t data_offset_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  bool checksummed_ = false;
  bool has_checksums_ = false;
  std::map<std::string, std::uint64_t> checksums_;
};

}  // namespace dopt
