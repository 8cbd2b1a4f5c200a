// Listening TCP sockets (IPv4 and IPv6) for the userspace proxy's workers:
// socket(2), setsockopt(2) SO_REUSEADDR and SO_REUSEPORT, bind(2), listen(2)
// and getsockname(2) - Node 20's net has no reusePort listen option, so the
// sockets of a SO_REUSEPORT group are made here and handed to each worker's
// event loop by descriptor. Also the queries that let a descriptor inherited
// from systemd's fd store be checked before it is used (getsockname,
// SO_ACCEPTCONN, SO_REUSEPORT, SO_TYPE, TCP_NODELAY) and F_DUPFD_CLOEXEC, so every worker
// owns (and may close) its own descriptor of a shared socket. Syscalls only:
// the address arrives parsed in TypeScript (IPv4 a host-order u32, IPv6 16
// bytes in network order). And
// shutdown(2) SHUT_WR for the proxy's fast relay (relay-raw.ts): its FIN
// without libuv's uv_shutdown round trip (POLLOUT armed, a loop turn, a JS
// completion), used only when nothing is queued on the socket.
#include "common.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace lbagent {

namespace {

int IntArg(const Napi::CallbackInfo& info, size_t i, const char* usage) {
  if (info.Length() <= i || !info[i].IsNumber()) throw Napi::TypeError::New(info.Env(), usage);
  return info[i].As<Napi::Number>().Int32Value();
}

// Binds and listens on a socket made by the caller; closes it on failure.
Napi::Value BindListen(Napi::Env env, int fd, sockaddr* addr, socklen_t addrlen, int backlog, bool reuse_port) {
  auto fail = [&](const char* syscall) {
    int err = errno;
    close(fd);
    return ErrnoError(env, err, syscall);
  };
  int on = 1;
  // libuv sets SO_REUSEADDR on every TCP listener (a restart binds while old
  // connections sit in TIME_WAIT); ours do the same.
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) < 0) throw fail("setsockopt");
  if (reuse_port && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) < 0) throw fail("setsockopt");
  // An IPv6 listener takes IPv6 clients only: an IPv4 VIP has a socket of its own.
  if (addr->sa_family == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on) < 0) throw fail("setsockopt");
  if (bind(fd, addr, addrlen) < 0) throw fail("bind");
  if (listen(fd, backlog) < 0) throw fail("listen");
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) < 0) throw fail("getsockname");
  uint16_t bound = ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port : reinterpret_cast<sockaddr_in*>(&ss)->sin_port;
  Napi::Object out = Napi::Object::New(env);
  out.Set("fd", Napi::Number::New(env, fd));
  out.Set("port", Napi::Number::New(env, ntohs(bound)));
  return out;
}

// listenTcp4(address: u32, port, backlog, reusePort) -> { fd, port }
Napi::Value ListenTcp4(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* usage = "listenTcp4(address: number (u32), port: number, backlog: number, reusePort: boolean)";
  if (info.Length() < 4 || !info[0].IsNumber() || !info[3].IsBoolean()) throw Napi::TypeError::New(env, usage);
  uint32_t address = info[0].As<Napi::Number>().Uint32Value();
  int port = IntArg(info, 1, usage);
  int backlog = IntArg(info, 2, usage);
  bool reuse_port = info[3].As<Napi::Boolean>().Value();
  if (port < 0 || port > 65535) throw Napi::RangeError::New(env, "port must be 0-65535");
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw ErrnoError(env, errno, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(address);
  return BindListen(env, fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr, backlog, reuse_port);
}

// listenTcp6(address: Uint8Array (16 bytes, network order), port, backlog, reusePort) -> { fd, port }
Napi::Value ListenTcp6(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* usage = "listenTcp6(address: Uint8Array (16 bytes), port: number, backlog: number, reusePort: boolean)";
  if (info.Length() < 4 || !info[0].IsTypedArray() || !info[3].IsBoolean()) throw Napi::TypeError::New(env, usage);
  Napi::TypedArray ta = info[0].As<Napi::TypedArray>();
  if (ta.TypedArrayType() != napi_uint8_array || ta.ElementLength() != 16) throw Napi::TypeError::New(env, usage);
  int port = IntArg(info, 1, usage);
  int backlog = IntArg(info, 2, usage);
  bool reuse_port = info[3].As<Napi::Boolean>().Value();
  if (port < 0 || port > 65535) throw Napi::RangeError::New(env, "port must be 0-65535");
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw ErrnoError(env, errno, "socket");
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_port = htons(static_cast<uint16_t>(port));
  memcpy(&addr.sin6_addr, ta.As<Napi::Uint8Array>().Data(), 16);
  return BindListen(env, fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr, backlog, reuse_port);
}

int IntSockopt(Napi::Env env, int fd, int level, int name) {
  int v = 0;
  socklen_t len = sizeof v;
  if (getsockopt(fd, level, name, &v, &len) < 0) throw ErrnoError(env, errno, "getsockopt");
  return v;
}

// socketInfo(fd) -> { family, type, address (u32, IPv4 only), address6 (16 bytes, IPv6 only), port, listening, reusePort, noDelay (TCP only) }
Napi::Value SocketInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = IntArg(info, 0, "socketInfo(fd: number)");
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) < 0) throw ErrnoError(env, errno, "getsockname");
  Napi::Object out = Napi::Object::New(env);
  out.Set("family", Napi::Number::New(env, ss.ss_family));
  out.Set("type", Napi::Number::New(env, IntSockopt(env, fd, SOL_SOCKET, SO_TYPE)));
  if (ss.ss_family == AF_INET) {
    const sockaddr_in* in = reinterpret_cast<const sockaddr_in*>(&ss);
    out.Set("address", Napi::Number::New(env, ntohl(in->sin_addr.s_addr)));
    out.Set("port", Napi::Number::New(env, ntohs(in->sin_port)));
  } else if (ss.ss_family == AF_INET6) {
    const sockaddr_in6* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    out.Set("address6", Napi::Buffer<uint8_t>::Copy(env, in6->sin6_addr.s6_addr, 16));
    out.Set("port", Napi::Number::New(env, ntohs(in6->sin6_port)));
  }
  out.Set("listening", Napi::Boolean::New(env, IntSockopt(env, fd, SOL_SOCKET, SO_ACCEPTCONN) != 0));
  out.Set("reusePort", Napi::Boolean::New(env, IntSockopt(env, fd, SOL_SOCKET, SO_REUSEPORT) != 0));
  if ((ss.ss_family == AF_INET || ss.ss_family == AF_INET6) && IntSockopt(env, fd, SOL_SOCKET, SO_TYPE) == SOCK_STREAM) {
    out.Set("noDelay", Napi::Boolean::New(env, IntSockopt(env, fd, IPPROTO_TCP, TCP_NODELAY) != 0));
  }
  return out;
}

// dupFd(fd) -> a new descriptor of the same socket (close-on-exec).
Napi::Value DupFd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = IntArg(info, 0, "dupFd(fd: number)");
  int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) throw ErrnoError(env, errno, "fcntl");
  return Napi::Number::New(env, copy);
}

}  // namespace

Napi::Object InitListenSocket(Napi::Env env, Napi::Object exports) {
  exports.Set("listenTcp4", Napi::Function::New(env, ListenTcp4, "listenTcp4"));
  exports.Set("listenTcp6", Napi::Function::New(env, ListenTcp6, "listenTcp6"));
  exports.Set("socketInfo", Napi::Function::New(env, SocketInfo, "socketInfo"));
  exports.Set("dupFd", Napi::Function::New(env, DupFd, "dupFd"));
  return exports;
}

}  // namespace lbagent
