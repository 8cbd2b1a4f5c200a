// sha256(bytes): SHA-256 through the OpenSSL that the node binary carries and
// exports to addons (SHA256(3), one shot). A primitive like a syscall: bytes
// in, 32 bytes out, no policy. agent/net/ownership.ts derives link names,
// MACs and DHCP client ids from it without loading node:crypto, which costs
// a DHCP service ~0.55 MiB of RSS for one hash per service.
#include "common.h"

#include <openssl/sha.h>

namespace lbagent {

namespace {

Napi::Value Sha256(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    throw Napi::TypeError::New(env, "sha256(data: Uint8Array)");
  }
  Napi::Uint8Array data = info[0].As<Napi::Uint8Array>();
  unsigned char md[SHA256_DIGEST_LENGTH];
  if (SHA256(data.Data(), data.ByteLength(), md) == nullptr) throw Napi::Error::New(env, "SHA256 failed");
  return Napi::Buffer<unsigned char>::Copy(env, md, sizeof md);
}

}  // namespace

Napi::Object InitDigest(Napi::Env env, Napi::Object exports) {
  exports.Set("sha256", Napi::Function::New(env, Sha256, "sha256"));
  return exports;
}

}  // namespace lbagent
