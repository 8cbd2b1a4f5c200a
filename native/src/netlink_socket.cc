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

class NetlinkHandle : public PolledSocket<NetlinkHandle> {
 public:
  static constexpr const char* kName = "netlink socket";
  // netlink_release() defers its frees to RCU callbacks: close(2) returns at once.
  static constexpr bool kCloseInBackground = false;
  // Reads per readiness callback at most: a datagram, an error or a dropped datagram each.
  static constexpr int kMaxReadsPerWake = 64;

  static Napi::Function Define(Napi::Env env) {
    return DefineSocket(env, "NetlinkHandle",
                        {
                            InstanceMethod("send", &NetlinkHandle::Send),
                            InstanceMethod("address", &NetlinkHandle::Address),
                            InstanceMethod("addMembership", &NetlinkHandle::AddMembership),
                            InstanceMethod("dropMembership", &NetlinkHandle::DropMembership),
                            InstanceMethod("setRecvBufferSize", &NetlinkHandle::SetRecvBufferSize),
                        });
  }

  // new NetlinkHandle(protocol): opened and bound, the port chosen by the
  // kernel (netlink(7): nl_pid 0 at bind is assigned a unique one).
  explicit NetlinkHandle(const Napi::CallbackInfo& info) : PolledSocket<NetlinkHandle>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "NetlinkHandle(protocol)");
    int64_t protocol = info[0].As<Napi::Number>().Int64Value();
    if (protocol < 0 || protocol > 31) throw Napi::RangeError::New(env, "protocol must be a netlink protocol (0..31)");
    OpenSocket(env, AF_NETLINK, SOCK_RAW, static_cast<int>(protocol));
    sockaddr_nl addr{};
    addr.nl_family = AF_NETLINK;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) FailAndClose(env, "bind");
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


  friend class PolledSocket<NetlinkHandle>;  // reads through Message and Item

  using Message = ReceivedFrom<sockaddr_nl, 0>;

  // ENOBUFS: the overrun is reported once; later datagrams are readable.
  static bool ReadOnAfter(int err) { return err == ENOBUFS; }

  // The datagram as a Buffer; a truncated one is dropped and reported (EMSGSIZE).
  Napi::Value Item(Napi::Env env, const Message&, msghdr&, const uint8_t* data, ssize_t n, ReadError* error) {
    if (static_cast<size_t>(n) > kSharedRecvBufferSize) {
      error->Set(EMSGSIZE, "recvmsg");
      return Napi::Value();
    }
    return Napi::Buffer<uint8_t>::Copy(env, data, static_cast<size_t>(n));
  }
};

}  // namespace

Napi::Object InitNetlinkSocket(Napi::Env env, Napi::Object exports) {
  exports.Set("NetlinkHandle", NetlinkHandle::Define(env));
  return exports;
}

}  // namespace lbagent
