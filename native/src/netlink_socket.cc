// NetlinkHandle: an AF_NETLINK/SOCK_RAW socket with readiness from libuv
// (uv_poll), the raw layer under the `netlink` package's framing and rtnetlink
// codecs (agent/net/netlink-socket.ts adapts it to the package's
// RawNetlinkSocket). The package's own prebuilt addon was a second
// .node file mapped into every agent (~0.25 MiB of RSS: its pages, relocations
// and symbol lookups against node's exports) for one socket class. Datagrams go
// in and out whole; nothing here parses them (netlink(7)).
#include "common.h"
#include "polled_socket.h"

#include <linux/netlink.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <memory>
#include <vector>

#ifndef SOL_NETLINK
#define SOL_NETLINK 270
#endif

namespace lbagent {

namespace {

// Datagrams handed to JavaScript per readiness callback; the poll is
// level-triggered, the rest is read on the next loop iteration.
constexpr int kMaxDatagramsPerWake = 64;

class NetlinkHandle : public PolledSocket<NetlinkHandle> {
 public:
  static constexpr const char* kName = "netlink socket";
  // netlink_release() defers its frees to RCU callbacks: close(2) returns at once.
  static constexpr bool kCloseInBackground = false;

  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "NetlinkHandle",
                       {
                           InstanceMethod("send", &NetlinkHandle::Send),
                           InstanceMethod("address", &NetlinkHandle::Address),
                           InstanceMethod("addMembership", &NetlinkHandle::AddMembership),
                           InstanceMethod("dropMembership", &NetlinkHandle::DropMembership),
                           InstanceMethod("setRecvBufferSize", &NetlinkHandle::SetRecvBufferSize),
                           InstanceMethod("start", &NetlinkHandle::JsStart),
                           InstanceMethod("setRef", &NetlinkHandle::JsSetRef),
                           InstanceMethod("close", &NetlinkHandle::JsClose),
                       });
  }

  // new NetlinkHandle(protocol): opened and bound, the port chosen by the
  // kernel (netlink(7): nl_pid 0 at bind is assigned a unique one).
  explicit NetlinkHandle(const Napi::CallbackInfo& info) : PolledSocket<NetlinkHandle>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "NetlinkHandle(protocol)");
    int64_t protocol = info[0].As<Napi::Number>().Int64Value();
    if (protocol < 0 || protocol > 31) throw Napi::RangeError::New(env, "protocol must be a netlink protocol (0..31)");
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, static_cast<int>(protocol));
    if (fd < 0) throw ErrnoError(env, errno, "socket");
    fd_ = fd;
    sockaddr_nl addr{};
    addr.nl_family = AF_NETLINK;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
      int err = errno;
      ::close(fd_);
      fd_ = -1;
      throw ErrnoError(env, err, "bind");
    }
    WatchTeardown(env);
  }

 private:

  // send(data: Buffer | Buffer[], port?, groups?): one datagram (the parts
  // gathered by sendmsg), to the kernel unless port/groups say otherwise.
  // Returns the bytes sent; throws the errno (EAGAIN, ENOBUFS included).
  Napi::Value Send(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CheckOpen(env);
    std::vector<iovec> iov;
    if (info.Length() >= 1 && info[0].IsBuffer()) {
      Napi::Buffer<uint8_t> b = info[0].As<Napi::Buffer<uint8_t>>();
      iov.push_back({b.Data(), b.Length()});
    } else if (info.Length() >= 1 && info[0].IsArray()) {
      Napi::Array parts = info[0].As<Napi::Array>();
      uint32_t n = parts.Length();
      if (n > UIO_MAXIOV) throw Napi::RangeError::New(env, "at most 1024 parts per datagram");
      iov.reserve(n);
      for (uint32_t i = 0; i < n; i++) {
        Napi::Value v = parts.Get(i);
        if (!v.IsBuffer()) throw Napi::TypeError::New(env, "send(data: Buffer | Buffer[]): a part is not a Buffer");
        Napi::Buffer<uint8_t> b = v.As<Napi::Buffer<uint8_t>>();
        iov.push_back({b.Data(), b.Length()});
      }
    } else {
      throw Napi::TypeError::New(env, "send(data: Buffer | Buffer[], port?: number, groups?: number)");
    }
    sockaddr_nl to{};
    to.nl_family = AF_NETLINK;
    if (info.Length() >= 2 && info[1].IsNumber()) to.nl_pid = info[1].As<Napi::Number>().Uint32Value();
    if (info.Length() >= 3 && info[2].IsNumber()) to.nl_groups = info[2].As<Napi::Number>().Uint32Value();
    msghdr msg{};
    msg.msg_name = &to;
    msg.msg_namelen = sizeof(to);
    msg.msg_iov = iov.data();
    msg.msg_iovlen = iov.size();
    ssize_t n;
    do {
      n = sendmsg(fd_, &msg, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0) throw ErrnoError(env, errno, "sendmsg");
    return Napi::Number::New(env, static_cast<double>(n));
  }

  // address(): { port, groups } (getsockname).
  Napi::Value Address(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CheckOpen(env);
    sockaddr_nl addr{};
    socklen_t len = sizeof(addr);
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) < 0) throw ErrnoError(env, errno, "getsockname");
    Napi::Object out = Napi::Object::New(env);
    out.Set("port", Napi::Number::New(env, addr.nl_pid));
    out.Set("groups", Napi::Number::New(env, addr.nl_groups));
    return out;
  }

  Napi::Value Membership(const Napi::CallbackInfo& info, int option) {
    Napi::Env env = info.Env();
    CheckOpen(env);
    if (info.Length() < 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "membership(group: number)");
    unsigned int group = info[0].As<Napi::Number>().Uint32Value();
    if (setsockopt(fd_, SOL_NETLINK, option, &group, sizeof(group)) < 0) throw ErrnoError(env, errno, "setsockopt");
    return env.Undefined();
  }
  Napi::Value AddMembership(const Napi::CallbackInfo& info) { return Membership(info, NETLINK_ADD_MEMBERSHIP); }
  Napi::Value DropMembership(const Napi::CallbackInfo& info) { return Membership(info, NETLINK_DROP_MEMBERSHIP); }

  // start(callback(err, datagrams: Buffer[])) (PolledSocket): every datagram
  // ready at each wake-up. A receive error (ENOBUFS: the kernel dropped
  // notifications) or a truncated datagram (EMSGSIZE, dropped) comes as err,
  // with what was read.

  // setRecvBufferSize(bytes): SO_RCVBUF (the kernel doubles it, capped by
  // net.core.rmem_max), as the package did.
  Napi::Value SetRecvBufferSize(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CheckOpen(env);
    if (info.Length() < 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "setRecvBufferSize(bytes: number)");
    int size = info[0].As<Napi::Number>().Int32Value();
    if (size <= 0) throw Napi::RangeError::New(env, "receive buffer size must be positive");
    if (setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size)) < 0) throw ErrnoError(env, errno, "setsockopt");
    return env.Undefined();
  }


  friend class PolledSocket<NetlinkHandle>;  // calls Drain

  void Drain(int status) {
    Napi::Env env = Env();
    Napi::HandleScope scope(env);
    Napi::Array datagrams = Napi::Array::New(env);
    uint32_t count = 0;
    int read_errno = 0;
    const char* failed_call = nullptr;
    bool can_read = fd_ >= 0;
    if (status < 0) can_read = PollError(status, &read_errno, &failed_call);
    // Bounded in reads, not datagrams: an error or a dropped datagram counts too.
    for (int reads = 0; can_read && reads < kMaxDatagramsPerWake && fd_ >= 0; reads++) {
      uint8_t* buffer = SharedRecvBuffer();
      sockaddr_nl from{};
      iovec iov{buffer, kSharedRecvBufferSize};
      msghdr msg{};
      msg.msg_name = &from;
      msg.msg_namelen = sizeof(from);
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      ssize_t n = recvmsg(fd_, &msg, MSG_TRUNC | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (read_errno == 0) {
          read_errno = errno;
          failed_call = "recvmsg";
        }
        // ENOBUFS: the overrun is reported once; later datagrams are readable.
        if (errno == ENOBUFS) continue;
        break;
      }
      if (static_cast<size_t>(n) > kSharedRecvBufferSize) {
        if (read_errno == 0) {
          read_errno = EMSGSIZE;
          failed_call = "recvmsg";
        }
        continue;
      }
      datagrams.Set(count++, Napi::Buffer<uint8_t>::Copy(env, buffer, static_cast<size_t>(n)));
    }
    if (count == 0 && read_errno == 0) return;
    Deliver(env, read_errno, failed_call, datagrams);
  }
};

}  // namespace

Napi::Object InitNetlinkSocket(Napi::Env env, Napi::Object exports) {
  exports.Set("NetlinkHandle", NetlinkHandle::Define(env));
  return exports;
}

}  // namespace lbagent
