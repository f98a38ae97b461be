// Writes the seeded corpora of the fuzz targets (fuzz/corpus/<target>/) with
// dopt's own writers, so that every seed is a well-formed input the fuzzer
// mutates from:   make_seeds OUT_DIR
// The seeds in the repository were made with it; run it again when a format
// changes (scripts/fuzz.sh seeds).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/basp_frame_check.hpp"
#include "fuzz_common.hpp"
#include "dopt/actors/rpc_serialize.hpp"
#include "dopt/runtime/internal/handshake.hpp"
#include "dopt/runtime/safetensors.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "tcp_wire.hpp"

namespace fs = std::filesystem;
using namespace dopt;

namespace {

fs::path g_out;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(g_out / target);
  std::ofstream(g_out / target / name, std::ios::binary) << bytes;
}

std::string basp(unsigned op, std::uint32_t len) {
  std::string f(32, '\0');
  f[0] = static_cast<char>(op);
  for (int k = 0; k < 4; ++k) f[4 + k] = static_cast<char>((len >> (24 - 8 * k)) & 0xff);
  return f + std::string(len, 'p');
}

template <class T>
std::string pod(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}


}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds OUT_DIR\n");
    return 2;
  }
  g_out = argv[1];
  // handshake: mode byte (bit 0 secret, bits 1-2 purpose, bit 3 server), then bytes.
  for (const bool secret : {false, true}) {
    net::ClientHandshake client(net::Purpose::control, dopt_fuzz::creds(secret, 1), "p", "seed");
    net::ServerHandshake server(net::Purpose::control, dopt_fuzz::creds(secret, 1), {});
    const std::string reply = server.on_hello(client.hello());
    const std::string proof = client.on_reply(reply);
    const std::string verdict = server.on_proof(proof);
    const char s = secret ? 1 : 0;
    put("handshake", std::string("server-") + (secret ? "secret" : "plain"), std::string(1, char(8 | 2 | s)) +
                                                                                  client.hello() + proof);
    put("handshake", std::string("client-") + (secret ? "secret" : "plain"),
        std::string(1, char(2 | s)) + reply + verdict);
  }
  // tcp_frames: a header, streams, the expected sequence number, a piece header.
  using namespace transport::tcp_detail;
  put("tcp_frames", "whole", pod(Header{k_magic, 0, 1, 2, 4096, 0, 0}) + std::string("\x02\x00", 2));
  put("tcp_frames", "striped",
      pod(Header{k_magic, 7, 3, 4, 1u << 20, 2, 5}) + std::string("\x02\x05", 2) +
          pod(PieceHeader{k_piece_magic, 5, 1u << 19}));
  // basp_frames: flags byte (bit 0 server side, bit 1 the unauthenticated bound), piece size, frames.
  put("basp_frames", "server", std::string("\x03\x07", 2) + basp(1, 200) + basp(2, 300) + basp(6, 0) + basp(4, 40));
  put("basp_frames", "client", std::string("\x00\x20", 2) + basp(0, 500) + basp(2, 64) + basp(5, 16));
  // rpc_decode: the type selector, then values as dopt::rpc writes them.
  {
    std::tuple<int, double, std::string, bool> a{42, 2.5, "hello", true};
    const auto b = rpc::to_bytes(a);
    put("rpc_decode", "tuple", std::string(1, '\0') + std::string(b.begin(), b.end()));
    Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    const auto c = rpc::to_bytes(t);
    put("rpc_decode", "tensor", std::string(1, '\1') + std::string(c.begin(), c.end()));
    std::vector<std::vector<std::string>> v{{"a", "bc"}, {}, {"def"}};
    const auto d = rpc::to_bytes(v);
    put("rpc_decode", "vectors", std::string(1, '\2') + std::string(d.begin(), d.end()));
    std::vector<Tensor> ts{t, Tensor::zeros({0}, DType::int64)};
    const auto e = rpc::to_bytes(ts);
    put("rpc_decode", "tensors", std::string(1, '\4') + std::string(e.begin(), e.end()));
  }
  // safetensors: files as dopt writes them (with checksums), every dtype.
  {
    std::map<std::string, Tensor> ts;
    ts["w"] = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
    ts["b"] = Tensor::from_vector(std::vector<double>{0.5});
    ts["i"] = Tensor::zeros({3}, DType::int32);
    ts["flag"] = Tensor::zeros({2}, DType::bool_);
    ts["h"] = Tensor::zeros({1, 2}, DType::float16);
    put("safetensors", "small", serialize_safetensors(ts, {{"note", "seed"}}));
    put("safetensors", "empty", serialize_safetensors({}, {}));
  }
  // state_dict: an optimizer's state as save_state_dict writes it.
  {
    StateDict sd;
    sd.state[0]["step"] = Tensor::from_vector(std::vector<float>{3});
    sd.state[0]["exp_avg"] = Tensor::from_vector(std::vector<float>{0.1f, 0.2f});
    sd.state[1]["momentum_buffer"] = Tensor::from_vector(std::vector<float>{1, 2, 3});
    StateDict::Group g;
    g.hyperparams = hyper_from_json(R"({"lr": 0.001, "betas": [0.9, 0.999], "amsgrad": false})", "seed");
    g.params = {0, 1};
    sd.param_groups.push_back(g);
    sd.metadata["dopt.zero.step"] = "3";
    const SafetensorsFile f = state_dict_to_safetensors(sd);
    put("state_dict", "adam", serialize_safetensors(f.tensors, f.metadata));
  }
  std::printf("seeds written to %s\n", g_out.c_str());
  return 0;
}
