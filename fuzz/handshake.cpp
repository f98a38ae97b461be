// Fuzz target: dopt's handshake (runtime/dopt/runtime/internal/handshake.hpp), both
// sides. The server reads a hello and a proof from a stranger; the client
// reads a reply and a verdict from whatever listens on the port it dialled.
// Every outcome is a refusal or a dopt::Error; nothing else may happen.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/handshake.hpp"
#include "fuzz_common.hpp"

using namespace dopt::net;


extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const unsigned mode = data[0];
  const std::string in(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool secret = mode & 1;
  const auto purpose = static_cast<Purpose>(1 + (mode >> 1) % 3);
  if (mode & 8) {
    // Server: the first kHelloSize bytes are the hello, the rest the proof.
    ServerHandshake server(purpose, dopt_fuzz::creds(secret, 0), [](const PeerHello& p) {
      return p.rank == 3 ? std::string("rank 3 is taken") : std::string();
    });
    (void)ServerHandshake::magic_ok(in);
    const std::string reply = server.on_hello(in.substr(0, kHelloSize));
    if (reply.size() != kReplySize) __builtin_trap();
    if (server.refused()) return 0;
    const std::string verdict = server.on_proof(in.size() > kHelloSize ? in.substr(kHelloSize) : std::string());
    if (verdict.size() != kVerdictSize) __builtin_trap();
    if (server.admitted() && secret) __builtin_trap();  // no forged proof passes a secret
    return 0;
  }
  // Client: the bytes are the server's reply, then its verdict.
  ClientHandshake client(purpose, dopt_fuzz::creds(secret, 0), "rank 0 at fuzz:1", "fuzz");
  try {
    const std::string proof = client.on_reply(in.substr(0, kReplySize));
    if (proof.size() != kProofSize) __builtin_trap();
    client.on_verdict(in.size() > kReplySize ? in.substr(kReplySize) : std::string());
    if (secret) __builtin_trap();  // a server that cannot prove the secret is never accepted
  } catch (const dopt::Error&) {
  }
  return 0;
}
