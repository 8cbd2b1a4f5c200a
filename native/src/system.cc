// Small system queries: capability sets (capget(2), for preflight),
// interface name/index lookups (if_nametoindex(3)), malloc_trim(3)
// (memory freed by short-lived threads stays in their malloc
// arenas until trimmed), and V8's low-memory notification (the one
// call that makes V8 hand back its pooled pages; no N-API equivalent).
#include "common.h"

#include <linux/capability.h>
#include <malloc.h>
#include <net/if.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <v8.h>

#include <cerrno>
#include <cstdint>
#include <string>

namespace lbagent {

namespace {

Napi::BigInt Mask(Napi::Env env, uint32_t low, uint32_t high) {
  return Napi::BigInt::New(env, (static_cast<uint64_t>(high) << 32) | low);
}

// capabilities(): { effective, permitted, inheritable } as bigint bit masks
// of this thread (bit n = capability n, e.g. CAP_NET_ADMIN = 12).
Napi::Value Capabilities(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  __user_cap_header_struct header{};
  header.version = _LINUX_CAPABILITY_VERSION_3;
  header.pid = 0;
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  // Raw syscall: no libcap dependency for two words of bits.
  if (syscall(SYS_capget, &header, data) < 0) throw ErrnoError(env, errno, "capget");
  Napi::Object out = Napi::Object::New(env);
  out.Set("effective", Mask(env, data[0].effective, data[1].effective));
  out.Set("permitted", Mask(env, data[0].permitted, data[1].permitted));
  out.Set("inheritable", Mask(env, data[0].inheritable, data[1].inheritable));
  return out;
}

Napi::Value IfNameToIndex(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) throw Napi::TypeError::New(env, "ifNameToIndex(name: string)");
  std::string name = info[0].As<Napi::String>().Utf8Value();
  unsigned int index = if_nametoindex(name.c_str());
  if (index == 0) throw ErrnoError(env, errno != 0 ? errno : ENODEV, "if_nametoindex", name.c_str());
  return Napi::Number::New(env, index);
}

Napi::Value IfIndexToName(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "ifIndexToName(index: number)");
  char name[IF_NAMESIZE] = {};
  if (if_indextoname(info[0].As<Napi::Number>().Uint32Value(), name) == nullptr) {
    throw ErrnoError(env, errno, "if_indextoname");
  }
  return Napi::String::New(env, name);
}

// mallocTrim(): malloc_trim(0): glibc returns the free pages of every malloc
// arena to the kernel (madvise(MADV_DONTNEED) inside each arena, not only at
// its top). true when some memory was released. The caller decides when.
Napi::Value MallocTrim(const Napi::CallbackInfo& info) {
#ifdef __GLIBC__
  return Napi::Boolean::New(info.Env(), malloc_trim(0) == 1);
#else
  return Napi::Boolean::New(info.Env(), false);
#endif
}

// lowMemoryNotification(): v8::Isolate::LowMemoryNotification(), V8's
// "collect all available garbage": full collections flagged to reduce the
// footprint, which (unlike the gc() of --expose-gc) also shrink the young
// generation, uncommit its idle semi-space and free V8's pool of emptied
// pages at once. A plain gc() leaves those to V8's heuristics (allocation
// throughput, the memory reducer's 8 s timer), so the agent's RSS after its
// start read ~1 MiB higher in some runs than in others. The caller decides when.
Napi::Value LowMemoryNotification(const Napi::CallbackInfo& info) {
  v8::Isolate* isolate = v8::Isolate::GetCurrent();
  if (isolate != nullptr) isolate->LowMemoryNotification();
  return info.Env().Undefined();
}

// collectUnderPressure(): v8::Isolate::MemoryPressureNotification(kCritical)
// on the isolate's own thread, which V8 answers at once with one full
// collection flagged to reduce the footprint (a second only when much is
// left to free), then the level back to none. Like LowMemoryNotification it
// shrinks the young generation and uncommits its idle semi-space; unlike it,
// it does not repeat the collection until nothing more is freed nor clear
// the compilation cache, so it costs about what gc() does (the
// measurements: agent/daemon/daemon.ts collectGarbage). The caller decides when.
Napi::Value CollectUnderPressure(const Napi::CallbackInfo& info) {
  v8::Isolate* isolate = v8::Isolate::GetCurrent();
  if (isolate != nullptr) {
    isolate->MemoryPressureNotification(v8::MemoryPressureLevel::kCritical);
    isolate->MemoryPressureNotification(v8::MemoryPressureLevel::kNone);
  }
  return info.Env().Undefined();
}

}  // namespace

Napi::Object InitSystem(Napi::Env env, Napi::Object exports) {
  exports.Set("capabilities", Napi::Function::New(env, Capabilities, "capabilities"));
  exports.Set("ifNameToIndex", Napi::Function::New(env, IfNameToIndex, "ifNameToIndex"));
  exports.Set("ifIndexToName", Napi::Function::New(env, IfIndexToName, "ifIndexToName"));
  exports.Set("mallocTrim", Napi::Function::New(env, MallocTrim, "mallocTrim"));
  exports.Set("lowMemoryNotification", Napi::Function::New(env, LowMemoryNotification, "lowMemoryNotification"));
  exports.Set("collectUnderPressure", Napi::Function::New(env, CollectUnderPressure, "collectUnderPressure"));
  return exports;
}

}  // namespace lbagent
