// lbagent_native: shared declarations. This addon is the syscall layer only:
// it opens, binds, configures, reads and writes file descriptors and reports
// readiness through libuv. Parsing, checksums and policy live in TypeScript
// (agent/net/*.ts); agent/net/native.ts is the only file that loads us.
#ifndef LBAGENT_NATIVE_COMMON_H_
#define LBAGENT_NATIVE_COMMON_H_

#include <napi.h>

namespace lbagent {

// An Error shaped like Node's own system errors: message
// "EPERM: operation not permitted, socket", and properties
// code ('EPERM'), errno (negative, as libuv and Node report it), syscall.
Napi::Error ErrnoError(Napi::Env env, int err, const char* syscall, const char* detail = nullptr);

Napi::Object InitPacketSocket(Napi::Env env, Napi::Object exports);
Napi::Object InitUnixDgram(Napi::Env env, Napi::Object exports);
Napi::Object InitSystem(Napi::Env env, Napi::Object exports);
Napi::Object InitListenSocket(Napi::Env env, Napi::Object exports);
Napi::Object InitTcpProbe(Napi::Env env, Napi::Object exports);
Napi::Object InitRelay(Napi::Env env, Napi::Object exports);
Napi::Object InitDigest(Napi::Env env, Napi::Object exports);
Napi::Object InitBpf(Napi::Env env, Napi::Object exports);

}  // namespace lbagent

#endif  // LBAGENT_NATIVE_COMMON_H_
