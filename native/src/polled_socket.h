// PolledSocket<T>: what the socket classes read through a uv_poll share
// (PacketHandle, NetlinkHandle, Icmp6Handle): the descriptor and its opening,
// its poll, keeping the wrapper alive while polling, setRef, close, the
// teardown with the environment (loop_handles.h), the read loop that hands
// each wake-up's datagrams to JavaScript in one call, and the JavaScript
// methods start, setRef and close (DefineSocket adds them to the class).
// T reads; it defines
// - `static constexpr const char* kName` ("packet socket": its errors, its
//   async resource), `kCloseInBackground` (close(2) on a background thread:
//   background.cc) and `kMaxReadsPerWake` (the poll is level-triggered, so
//   what is left is read on the next loop iteration; the cap only keeps one
//   busy socket from starving timers and other sockets);
// - `Message`: the sender's address and the control buffer of one recvmsg
//   (its iovec is the shared receive buffer), a ReceivedFrom below;
// - `Napi::Value Item(Napi::Env, const Message&, msghdr&, const uint8_t*
//   data, ssize_t n, ReadError*)`: what one datagram of n bytes
//   (its real length: recvmsg's MSG_TRUNC) becomes in JavaScript, or an
//   empty Value to skip it;
// - `static bool ReadOnAfter(int err)`: whether a receive error leaves later
//   datagrams readable (netlink's ENOBUFS), so the loop reads on.
#ifndef LBAGENT_NATIVE_POLLED_SOCKET_H_
#define LBAGENT_NATIVE_POLLED_SOCKET_H_

#include "common.h"
#include "loop_handles.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <memory>
#include <utility>
#include <vector>

namespace lbagent {

// The first receive error of a wake-up, reported with what was read.
struct ReadError {
  int err = 0;
  const char* call = nullptr;
  void Set(int e, const char* c) {
    if (err != 0) return;
    err = e;
    call = c;
  }
};

// Where one recvmsg puts the sender's address (`from`) and, when kControl >
// 0, kControl bytes of ancillary data.
template <typename Address, size_t kControl>
struct ReceivedFrom {
  Address from{};
  alignas(cmsghdr) char control[kControl > 0 ? kControl : 1];
  void Prepare(msghdr* msg) {
    msg->msg_name = &from;
    msg->msg_namelen = sizeof(from);
    if (kControl == 0) return;
    msg->msg_control = control;
    msg->msg_controllen = kControl;
  }
};

template <typename T>
class PolledSocket : public Napi::ObjectWrap<T> {
 public:
  explicit PolledSocket(const Napi::CallbackInfo& info) : Napi::ObjectWrap<T>(info) {}
  ~PolledSocket() override { Release(); }

 protected:
  using Methods = std::vector<typename Napi::ObjectWrap<T>::PropertyDescriptor>;

  // The class `name` with T's own methods and start, setRef and close.
  static Napi::Function DefineSocket(Napi::Env env, const char* name, Methods methods) {
    methods.push_back(Napi::ObjectWrap<T>::InstanceMethod("start", &PolledSocket::JsStart));
    methods.push_back(Napi::ObjectWrap<T>::InstanceMethod("setRef", &PolledSocket::JsSetRef));
    methods.push_back(Napi::ObjectWrap<T>::InstanceMethod("close", &PolledSocket::JsClose));
    return Napi::ObjectWrap<T>::DefineClass(env, name, methods);
  }

  // socket(domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol) as fd_.
  void OpenSocket(Napi::Env env, int domain, int type, int protocol) {
    int fd = socket(domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol);
    if (fd < 0) throw ErrnoError(env, errno, "socket");
    fd_ = fd;
  }

  // Setting up the socket failed in `syscall` (errno): closed, and thrown.
  [[noreturn]] void FailAndClose(Napi::Env env, const char* syscall) {
    int err = errno;
    if (T::kCloseInBackground) CloseInBackground(fd_);
    else ::close(fd_);
    fd_ = -1;
    throw ErrnoError(env, err, syscall);
  }

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

  int fd_ = -1;

 private:
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

  // Reads every queued datagram (up to T::kMaxReadsPerWake reads) and hands
  // them to JavaScript in one call, with the first receive error if any.
  void Drain(int status) {
    Napi::Env env = this->Env();
    Napi::HandleScope scope(env);
    Napi::Array items = Napi::Array::New(env);
    uint32_t count = 0;
    ReadError error;
    bool can_read = fd_ >= 0;
    if (status < 0) can_read = PollError(status, &error.err, &error.call);
    T* self = static_cast<T*>(this);
    for (int reads = 0; can_read && reads < T::kMaxReadsPerWake && fd_ >= 0; reads++) {
      uint8_t* buffer = SharedRecvBuffer();
      iovec iov{buffer, kSharedRecvBufferSize};
      typename T::Message message{};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      message.Prepare(&msg);
      ssize_t n = recvmsg(fd_, &msg, MSG_TRUNC | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        // e.g. ENETDOWN when a packet socket's interface goes down: reported, the socket kept.
        int err = errno;
        error.Set(err, "recvmsg");
        if (T::ReadOnAfter(err)) continue;
        break;
      }
      Napi::Value item = self->Item(env, message, msg, buffer, n, &error);
      if (!item.IsEmpty()) items.Set(count++, item);
    }
    if (count == 0 && error.err == 0) return;
    Deliver(env, error.err, error.call, items);
  }

  static void OnReadable(uv_poll_t* handle, int status, int events) {
    try {
      static_cast<PolledSocket*>(handle->data)->Drain(status);
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
