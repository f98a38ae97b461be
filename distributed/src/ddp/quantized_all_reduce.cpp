#include "dopt/distributed/quantized_all_reduce.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "dopt/runtime/dtype.hpp"
#include "dopt/runtime/error.hpp"

namespace dopt::optim {

std::string_view wire_format_name(WireFormat f) noexcept {
  switch (f) {
    case WireFormat::float32: return "float32";
    case WireFormat::bfloat16: return "bfloat16";
    case WireFormat::float16: return "float16";
    case WireFormat::int8: return "int8";
    case WireFormat::int4: return "int4";
  }
  return "?";
}

WireFormat parse_wire_format(std::string_view name) {
  if (name == "float32" || name == "fp32") return WireFormat::float32;
  if (name == "bfloat16" || name == "bf16") return WireFormat::bfloat16;
  if (name == "float16" || name == "fp16") return WireFormat::float16;
  if (name == "int8") return WireFormat::int8;
  if (name == "int4" || name == "4bit") return WireFormat::int4;
  throw ValueError("parse_wire_format", "unknown wire format '" + std::string(name) +
                                            "' (known: float32, bfloat16, float16, int8, int4)");
}

namespace {

std::int64_t rows_of(std::int64_t m, std::int64_t row_size) { return (m + row_size - 1) / row_size; }

int qmax_of(WireFormat f) { return f == WireFormat::int8 ? 127 : 7; }

// Per-row scale and quantized value, float32 arithmetic.
float row_scale(const float* x, std::int64_t m, int qmax) {
  float amax = 0.0f;
  for (std::int64_t i = 0; i < m; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax / static_cast<float>(qmax);
}

/// q[i] = clamp(round-half-even(x[i] / scale), -qmax, qmax) for one row (0
/// for a zero or non-finite scale). Rounding adds and subtracts 1.5 * 2^23,
/// which rounds to nearest even for |v| <= qmax in the default rounding
/// mode (the build does not reassociate floating point); the loop vectorizes.
void quantize_row(const float* x, std::int64_t m, float scale, int qmax, std::int8_t* q) {
  if (scale == 0.0f || !std::isfinite(scale)) {
    std::memset(q, 0, static_cast<std::size_t>(m));
    return;
  }
  const float hi = static_cast<float>(qmax), lo = -hi, magic = 12582912.0f;
  for (std::int64_t i = 0; i < m; ++i) {
    float v = x[i] / scale;
    v = v == v ? v : 0.0f;  // NaN -> 0
    v = v < lo ? lo : (v > hi ? hi : v);
    q[i] = static_cast<std::int8_t>((v + magic) - magic);
  }
}

}  // namespace

std::int64_t encoded_bytes(WireFormat f, std::int64_t m, std::int64_t row_size) {
  switch (f) {
    case WireFormat::float32: return 4 * m;
    case WireFormat::bfloat16:
    case WireFormat::float16: return 2 * m;
    case WireFormat::int8: return 4 * rows_of(m, row_size) + m;
    case WireFormat::int4: return 4 * rows_of(m, row_size) + (m + 1) / 2;
  }
  return 0;
}

void encode_chunk(WireFormat f, const float* x, std::int64_t m, std::int64_t row_size, std::uint8_t* out) {
  switch (f) {
    case WireFormat::float32:
      if (m) std::memcpy(out, x, static_cast<std::size_t>(m) * 4);
      return;
    case WireFormat::bfloat16:
      for (std::int64_t i = 0; i < m; ++i) {
        const std::uint16_t b = float_to_bfloat16(x[i]);
        std::memcpy(out + 2 * i, &b, 2);
      }
      return;
    case WireFormat::float16:
      for (std::int64_t i = 0; i < m; ++i) {
        const std::uint16_t h = float_to_half(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case WireFormat::int8:
    case WireFormat::int4: {
      const int qmax = qmax_of(f);
      const std::int64_t rows = rows_of(m, row_size);
      std::uint8_t* payload = out + 4 * rows;
      std::vector<std::int8_t> tmp(f == WireFormat::int4 ? static_cast<std::size_t>(row_size) + 1 : 0);
      for (std::int64_t row = 0; row < rows; ++row) {
        const std::int64_t first = row * row_size, len = std::min(row_size, m - first);
        const float s = row_scale(x + first, len, qmax);
        std::memcpy(out + 4 * row, &s, 4);
        if (f == WireFormat::int8) {
          quantize_row(x + first, len, s, qmax, reinterpret_cast<std::int8_t*>(payload + first));
          continue;
        }
        // int4: rows start at even elements when row_size is even; pack
        // element by element otherwise.
        quantize_row(x + first, len, s, qmax, tmp.data());
        for (std::int64_t i = 0; i < len; ++i) {
          const std::int64_t e = first + i;
          const auto nib = static_cast<std::uint8_t>(tmp[static_cast<std::size_t>(i)] + 8);
          if (e % 2 == 0) payload[e / 2] = nib;
          else payload[e / 2] = static_cast<std::uint8_t>(payload[e / 2] | (nib << 4));
        }
      }
      return;
    }
  }
}

void decode_chunk(WireFormat f, const std::uint8_t* in, std::int64_t m, std::int64_t row_size, float* x) {
  switch (f) {
    case WireFormat::float32:
      if (m) std::memcpy(x, in, static_cast<std::size_t>(m) * 4);
      return;
    case WireFormat::bfloat16:
    case WireFormat::float16:
      for (std::int64_t i = 0; i < m; ++i) {
        std::uint16_t b;
        std::memcpy(&b, in + 2 * i, 2);
        x[i] = f == WireFormat::bfloat16 ? bfloat16_to_float(b) : half_to_float(b);
      }
      return;
    case WireFormat::int8:
    case WireFormat::int4: {
      const std::int64_t rows = rows_of(m, row_size);
      const std::uint8_t* payload = in + 4 * rows;
      for (std::int64_t row = 0; row < rows; ++row) {
        const std::int64_t first = row * row_size, len = std::min(row_size, m - first);
        float s;
        std::memcpy(&s, in + 4 * row, 4);
        if (f == WireFormat::int8) {
          const auto* q = reinterpret_cast<const std::int8_t*>(payload);
          for (std::int64_t i = first; i < first + len; ++i) x[i] = static_cast<float>(q[i]) * s;
          continue;
        }
        for (std::int64_t i = first; i < first + len; ++i) {
          const std::uint8_t byte = payload[i / 2];
          const int q = static_cast<int>(i % 2 == 0 ? (byte & 0x0F) : (byte >> 4)) - 8;
          x[i] = static_cast<float>(q) * s;
        }
      }
      return;
    }
  }
}

std::pair<std::int64_t, std::int64_t> chunk_range(std::int64_t numel, int n, int c, std::int64_t row_size) {
  const std::int64_t rows = rows_of(numel, row_size);
  const std::int64_t r0 = rows * c / n, r1 = rows * (c + 1) / n;
  return {std::min(numel, r0 * row_size), std::min(numel, r1 * row_size)};
}

std::uint64_t quantized_all_reduce_bytes(std::int64_t numel, int n, int r, const QuantizedAllReduceOptions& o) {
  std::uint64_t b = 0;
  for (int c = 0; c < n; ++c) {
    if (c == r) continue;
    const auto [a, e] = chunk_range(numel, n, c, o.row_size);
    b += static_cast<std::uint64_t>(encoded_bytes(o.format, e - a, o.row_size));
  }
  const auto [a, e] = chunk_range(numel, n, r, o.row_size);
  b += static_cast<std::uint64_t>(n - 1) * static_cast<std::uint64_t>(encoded_bytes(o.format, e - a, o.row_size));
  return b;
}

std::uint64_t quantized_all_reduce(ProcessGroup& group, const Tensor& buffer, const QuantizedAllReduceOptions& o,
                                   const Tensor& residual) {
  static constexpr const char* op = "quantized_all_reduce";
  if (!group.valid()) throw ValueError(op, "the process group is invalid");
  if (!buffer.defined() || !buffer.device().is_cpu() || buffer.dtype() != DType::float32 || buffer.dim() != 1)
    throw TypeError(op, "the buffer must be a 1-D float32 CPU tensor, got " +
                            (buffer.defined() ? buffer.str() : std::string("an undefined tensor")));
  if (residual.defined() && (!residual.device().is_cpu() || residual.dtype() != DType::float32 ||
                             residual.numel() != buffer.numel()))
    throw TypeError(op, "the residual must be a float32 CPU tensor of " + std::to_string(buffer.numel()) +
                            " elements, got " + residual.str());
  if (o.row_size < 1) throw ValueError(op, "row_size must be >= 1, got " + std::to_string(o.row_size));
  if (!group.is_member()) return 0;
  const int n = group.size(), r = group.rank();
  const std::int64_t numel = buffer.numel();
  float* x = buffer.data<float>();

  // Step 2 input: x (+ residual), in the buffer itself (it is overwritten
  // with the result at the end), encoded chunk by chunk.
  if (residual.defined()) {
    const float* e = residual.data<float>();
    for (std::int64_t i = 0; i < numel; ++i) x[i] += e[i];
  }
  std::vector<Tensor> mine(static_cast<std::size_t>(n));
  std::vector<float> back;
  for (int c = 0; c < n; ++c) {
    const auto [a, e] = chunk_range(numel, n, c, o.row_size);
    Tensor enc = Tensor::empty({encoded_bytes(o.format, e - a, o.row_size)}, DType::uint8);
    encode_chunk(o.format, x + a, e - a, o.row_size, enc.data<std::uint8_t>());
    mine[static_cast<std::size_t>(c)] = enc;
    if (residual.defined()) {  // what this chunk's encoding lost
      back.resize(static_cast<std::size_t>(e - a));
      decode_chunk(o.format, enc.data<std::uint8_t>(), e - a, o.row_size, back.data());
      float* res = residual.data<float>() + a;
      for (std::int64_t i = 0; i < e - a; ++i) res[i] = x[a + i] - back[static_cast<std::size_t>(i)];
    }
  }

  std::uint64_t sent = 0;
  const auto [my_a, my_e] = chunk_range(numel, n, r, o.row_size);
  const std::int64_t my_m = my_e - my_a;
  const std::int64_t my_bytes = encoded_bytes(o.format, my_m, o.row_size);
  std::vector<Future<void>> pending;
  // Step 2: reduce-scatter of the encoded chunks.
  std::vector<Tensor> got(static_cast<std::size_t>(n));
  for (int s = 0; s < n; ++s) {
    if (s == r || my_bytes == 0) continue;
    got[static_cast<std::size_t>(s)] = Tensor::empty({my_bytes}, DType::uint8);
    pending.push_back(group.recv_async(got[static_cast<std::size_t>(s)], s, o.tag));
  }
  std::vector<Future<void>> sends;
  for (int c = 0; c < n; ++c) {
    if (c == r || mine[static_cast<std::size_t>(c)].numel() == 0) continue;
    sends.push_back(group.send_async(mine[static_cast<std::size_t>(c)], c, o.tag));
    sent += static_cast<std::uint64_t>(mine[static_cast<std::size_t>(c)].numel());
  }
  for (auto& f : pending) f.get();
  pending.clear();
  // Step 3: float32 sum in group-rank order, then the division.
  std::vector<float> acc(static_cast<std::size_t>(my_m), 0.0f), part(static_cast<std::size_t>(my_m));
  for (int s = 0; s < n; ++s) {
    if (my_m == 0) break;
    const Tensor& enc = s == r ? mine[static_cast<std::size_t>(r)] : got[static_cast<std::size_t>(s)];
    decode_chunk(o.format, enc.data<std::uint8_t>(), my_m, o.row_size, part.data());
    for (std::int64_t i = 0; i < my_m; ++i) acc[static_cast<std::size_t>(i)] += part[static_cast<std::size_t>(i)];
  }
  const float nf = static_cast<float>(n);
  for (auto& v : acc) v = v / nf;
  // Step 4: all-gather of the re-quantized reduced chunks.
  Tensor reduced = Tensor::empty({my_bytes}, DType::uint8);
  encode_chunk(o.format, acc.data(), my_m, o.row_size, reduced.data<std::uint8_t>());
  std::vector<Tensor> gathered(static_cast<std::size_t>(n));
  for (int c = 0; c < n; ++c) {
    if (c == r) continue;
    const auto [a, e] = chunk_range(numel, n, c, o.row_size);
    gathered[static_cast<std::size_t>(c)] = Tensor::empty({encoded_bytes(o.format, e - a, o.row_size)}, DType::uint8);
    if (e == a) continue;
    pending.push_back(group.recv_async(gathered[static_cast<std::size_t>(c)], c, o.tag + 1));
  }
  for (int c = 0; c < n; ++c) {
    if (c == r || my_bytes == 0) continue;
    sends.push_back(group.send_async(reduced, c, o.tag + 1));
    sent += static_cast<std::uint64_t>(my_bytes);
  }
  gathered[static_cast<std::size_t>(r)] = reduced;
  for (auto& f : pending) f.get();
  for (auto& f : sends) f.get();
  for (int c = 0; c < n; ++c) {
    const auto [a, e] = chunk_range(numel, n, c, o.row_size);
    decode_chunk(o.format, gathered[static_cast<std::size_t>(c)].data<std::uint8_t>(), e - a, o.row_size, x + a);
  }
  return sent;
}

}  // namespace dopt::optim
