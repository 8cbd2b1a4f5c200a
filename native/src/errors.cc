// Node-style system errors for the addon (see common.h).
#include "common.h"

#include <uv.h>

#include <string>

namespace lbagent {

Napi::Error ErrnoError(Napi::Env env, int err, const char* syscall, const char* detail) {
  // libuv's names and messages take the negated errno, and are what Node
  // itself uses, so our errors read exactly like fs/net errors.
  const char* code = uv_err_name(-err);
  const char* text = uv_strerror(-err);
  std::string message = std::string(code) + ": " + text + ", " + syscall;
  if (detail != nullptr) message += std::string(" '") + detail + "'";
  Napi::Error error = Napi::Error::New(env, message);
  error.Set("code", Napi::String::New(env, code));
  error.Set("errno", Napi::Number::New(env, -err));
  error.Set("syscall", Napi::String::New(env, syscall));
  if (detail != nullptr) error.Set("path", Napi::String::New(env, detail));
  return error;
}

}  // namespace lbagent
