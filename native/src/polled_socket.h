// PolledSocket<T>: what the socket classes read through a uv_poll share
// (PacketHandle, NetlinkHandle): the descriptor, its poll, keeping the
// wrapper alive while polling, setRef, close, the teardown with the
// environment (loop_handles.h) and the hand-over of each wake-up's reads to
// JavaScript, and the JavaScript methods start, setRef and close. T reads:
// it defines `void Drain(int status)`, which calls PollError() for a
// status < 0 and Deliver() with what it read, `static constexpr const char*
// kName` ("packet socket": its errors, its async resource) and binds JsStart, JsSetRef and
// JsClose in its class definition.
#ifndef LBAGENT_NATIVE_POLLED_SOCKET_H_
#define LBAGENT_NATIVE_POLLED_SOCKET_H_

#include "common.h"
#include "loop_handles.h"

#include <unistd.h>
#include <uv.h>

#include <memory>

namespace lbagent {

template <typename T>
class PolledSocket : public Napi::ObjectWrap<T> {
 public:
  explicit PolledSocket(const Napi::CallbackInfo& info) : Napi::ObjectWrap<T>(info) {}
  ~PolledSocket() override { Release(); }

 protected:
  // start(callback(err, items)): each wake-up's reads in one call.
  Napi::Value JsStart(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CheckOpen(env);
    if (info.Length() < 1 || !info[0].IsFunction()) throw Napi::TypeError::New(env, "start(callback)");
    StartPolling(env, info[0].As<Napi::Function>());
    return env.Undefined();
  }

  // setRef(bool): whether an active socket keeps the event loop alive.
  Napi::Value JsSetRef(const Napi::CallbackInfo& info) {
    SetRefState(info.Length() > 0 && info[0].ToBoolean().Value());
    return info.Env().Undefined();
  }

  // close(): no callback after it.
  Napi::Value JsClose(const Napi::CallbackInfo& info) {
    StopPolling();
    Release();
    callback_.Reset();
    return info.Env().Undefined();
  }

  // The descriptor is set up: close it with the environment (process exit,
  // worker end) even if the socket is never closed, so no poll callback may
  // run into a dying VM.
  void WatchTeardown(Napi::Env env) { teardown_.Add(env, this); }

  void CheckOpen(Napi::Env env) {
    if (fd_ < 0) throw ErrnoError(env, EBADF, T::kName, "closed");
  }

  void StartPolling(Napi::Env env, Napi::Function callback) {
    callback_ = Napi::Persistent(callback);
    if (!context_) context_ = std::make_unique<Napi::AsyncContext>(env, T::kName);
    if (poll_ == nullptr) {
      int rc = 0;
      const char* call = nullptr;
      poll_ = StartReadPoll(env, fd_, this, &PolledSocket::OnReadable, &rc, &call);
      if (poll_ == nullptr) throw ErrnoError(env, -rc, call);
      if (!referenced_) uv_unref(reinterpret_cast<uv_handle_t*>(poll_));
    } else {
      int rc = uv_poll_start(poll_, UV_READABLE, &PolledSocket::OnReadable);
      if (rc < 0) throw ErrnoError(env, -rc, "uv_poll_start");
    }
    if (!polling_) {
      polling_ = true;
      this->Ref();  // keep the wrapper alive while the kernel may call us back
    }
  }

  void StopPolling() {
    if (poll_ != nullptr) uv_poll_stop(poll_);
    if (polling_) {
      polling_ = false;
      this->Unref();
    }
  }

  void SetRefState(bool ref) {
    referenced_ = ref;
    if (poll_ != nullptr) {
      if (referenced_) uv_ref(reinterpret_cast<uv_handle_t*>(poll_));
      else uv_unref(reinterpret_cast<uv_handle_t*>(poll_));
    }
  }

  // For Drain, a wake-up with status < 0 (TakePollError): whether to read on;
  // the poll, which libuv stopped, is started again if so.
  bool PollError(int status, int* read_errno, const char** failed_call) {
    if (fd_ < 0 || !TakePollError(fd_, status, read_errno, failed_call)) return false;
    if (polling_ && poll_ != nullptr) uv_poll_start(poll_, UV_READABLE, &PolledSocket::OnReadable);
    return true;
  }

  void Deliver(Napi::Env env, int read_errno, const char* failed_call, Napi::Value items) {
    if (callback_.IsEmpty() || !context_) return;
    DeliverReads(env, callback_, *context_, read_errno, failed_call, items);
  }

  int fd_ = -1;

 private:
  // Closes the poll handle before the descriptor, as libuv requires.
  // `hook`: called from the environment's teardown (loop_handles.h).
  void Release(napi_async_cleanup_hook_handle hook = nullptr) {
    teardown_.Remove();
    CloseHandles({reinterpret_cast<uv_handle_t*>(poll_)}, hook);
    poll_ = nullptr;
    if (fd_ >= 0) {
      // The poll is closed: libuv watches the descriptor no more.
      if (T::kCloseInBackground) CloseInBackground(fd_);
      else ::close(fd_);
      fd_ = -1;
    }
  }

  static void OnReadable(uv_poll_t* handle, int status, int events) {
    try {
      static_cast<T*>(static_cast<PolledSocket*>(handle->data))->Drain(status);
    } catch (...) {
      // Nothing may unwind into libuv. Exceptions from JavaScript are handled
      // in Deliver; what is left means the VM cannot run code now.
    }
  }

  uv_poll_t* poll_ = nullptr;
  bool polling_ = false;
  bool referenced_ = true;
  EnvTeardown teardown_;
  friend class ::lbagent::EnvTeardown;  // runs Release(hook) at the environment's teardown
  Napi::FunctionReference callback_;
  std::unique_ptr<Napi::AsyncContext> context_;
};

}  // namespace lbagent

#endif  // LBAGENT_NATIVE_POLLED_SOCKET_H_
