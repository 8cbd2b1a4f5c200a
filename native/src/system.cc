// Small system queries: capability sets (capget(2), for preflight) and
// interface name/index lookups (if_nametoindex(3)).
#include "common.h"

#include <linux/capability.h>
#include <net/if.h>
#include <sys/syscall.h>
#include <unistd.h>

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

}  // namespace

Napi::Object InitSystem(Napi::Env env, Napi::Object exports) {
  exports.Set("capabilities", Napi::Function::New(env, Capabilities, "capabilities"));
  exports.Set("ifNameToIndex", Napi::Function::New(env, IfNameToIndex, "ifNameToIndex"));
  exports.Set("ifIndexToName", Napi::Function::New(env, IfIndexToName, "ifIndexToName"));
  return exports;
}

}  // namespace lbagent
