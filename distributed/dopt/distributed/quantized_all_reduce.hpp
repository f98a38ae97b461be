#pragma once
// Averaging a float32 buffer over a process group in a compressed wire format
// (DiLoCo's pseudo-gradients, diloco.hpp; docs/diloco.md).
//
//   std::vector<float> x = ...;                     // same length on every rank
//   Tensor buf = Tensor::from_vector(x);
//   QuantizedAllReduceOptions o;
//   o.format = WireFormat::int8;
//   std::uint64_t sent = quantized_all_reduce(group, buf, o);   // buf <- mean over ranks
//
// What travels, in order (n = group.size(), this rank r):
//  1. The buffer is cut into n chunks at row boundaries (a row is
//     `row_size` consecutive elements; chunk c holds rows
//     [c * R / n, (c + 1) * R / n) of the R = ceil(N / row_size) rows).
//  2. Reduce-scatter of quantized chunks: rank r encodes every chunk of its
//     buffer (plus its error-feedback residual, when given) and sends chunk c
//     to rank c (point to point, n - 1 messages).
//  3. Float32 reduction: rank r decodes the n encodings of its chunk r and adds
//     them in float32 in group-rank order (0, 1, ..., n-1), then divides the
//     sum by n in float32 (sum first, then divide).
//  4. All-gather of the re-quantized result: rank r encodes its reduced chunk
//     once and sends it to every other rank; every rank decodes all n reduced
//     chunks into the buffer. Every rank thus ends with the same values,
//     decoded from the same bytes.
// Bytes this rank puts on the wire: the encodings of the n - 1 chunks it
// sends in step 2 plus n - 1 copies of its reduced chunk in step 4.
//
// Encodings of a chunk of m elements (q: per row, a float32 scale
// s = max|x| / qmax, then q = round-half-even(x / s) clamped to
// [-qmax, qmax]; a row of zeros has s = 0 and q = 0; decode: q * s):
//   float32   4 m bytes (the values themselves; still the same three steps)
//   bfloat16  2 m bytes (round to nearest even)
//   float16   2 m bytes (round to nearest even; beyond float16's range: inf)
//   int8      4 bytes per row + m bytes, qmax = 127
//   int4      4 bytes per row + ceil(m / 2) bytes, qmax = 7, two values per
//             byte (the element of even index in the low nibble), stored as q + 8
//
// Error feedback: with `residual` (float32, same numel), step 2 quantizes
// x + residual and then sets residual <- (x + residual) - decode(encoding),
// what this rank's contribution lost, to be added at the next call.
//
// Collective contract: every rank of `group` calls it with buffers of the
// same numel and the same options. It talks only point to point, on the
// tags `options.tag` and `options.tag + 1`, so it never takes a collective
// sequence number: it may run on another thread than the caller's other
// collectives of the same group (DiLoCo runs it on a worker thread to overlap
// it with inner steps); two calls on the same group and tags must not
// overlap. Errors of the group (a lost peer: PeerLostError naming it; a
// timeout) are thrown; the buffer then holds undefined values. Non-members:
// nothing happens, 0 bytes. A float32 CPU 1-D contiguous buffer only
// (TypeError / ValueError otherwise).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim {

enum class WireFormat : std::uint8_t { float32, bfloat16, float16, int8, int4 };

/// "float32", "bfloat16", "float16", "int8", "int4".
std::string_view wire_format_name(WireFormat f) noexcept;
/// The inverse of wire_format_name (also "fp32", "bf16", "fp16", "4bit");
/// anything else is a ValueError listing the names.
WireFormat parse_wire_format(std::string_view name);

struct QuantizedAllReduceOptions {
  WireFormat format = WireFormat::int8;
  /// Elements per scale (int8, int4) and the granularity of the chunks.
  std::int64_t row_size = 256;
  /// The first of the two point-to-point tags used.
  int tag = 0x0D1C0;
};

/// Bytes of the encoding of m elements.
std::int64_t encoded_bytes(WireFormat f, std::int64_t m, std::int64_t row_size);
/// Encodes x[0..m) into out (encoded_bytes(f, m, row_size) bytes).
void encode_chunk(WireFormat f, const float* x, std::int64_t m, std::int64_t row_size, std::uint8_t* out);
/// Decodes an encoding of m elements into x[0..m).
void decode_chunk(WireFormat f, const std::uint8_t* in, std::int64_t m, std::int64_t row_size, float* x);
/// Element range [first, last) of chunk c of n for a buffer of numel elements.
std::pair<std::int64_t, std::int64_t> chunk_range(std::int64_t numel, int n, int c, std::int64_t row_size);

/// buffer <- the mean over the group through the wire format (see the
/// header). Returns the bytes this rank sent.
std::uint64_t quantized_all_reduce(ProcessGroup& group, const Tensor& buffer,
                                   const QuantizedAllReduceOptions& options, const Tensor& residual = Tensor());

/// The bytes a rank sends in one quantized_all_reduce of numel elements
/// over n ranks as rank r (computed, no communication).
std::uint64_t quantized_all_reduce_bytes(std::int64_t numel, int n, int r, const QuantizedAllReduceOptions& options);

}  // namespace dopt::optim
